"""What the compiler holds at its peak: the live buffers of one planned step.

Plans a corpus or zoo model at a budget (``none``: the function as written; ``hand``: every
block in its library's own remat with ``nothing_saveable``, the hand baseline), compiles the
step ahead of time for the target with XLA's dumps on, and reads the dumped buffer
assignment and live ranges: the temporaries live at the peak of the compiler's schedule,
largest first, each with the operation that made it, and their bytes by what made them
(:data:`KINDS`). The step's peak is the arguments, the outputs and those temporaries. For
finding where the memory model and the compiler disagree (``bench/results/no-remat.md``,
the corpus tables), and what a plan can gain on a baseline
(``bench/results/compiler-peak-hand.md``).

    python bench/compiler_peak.py --model nnx-transformer --budget floor
    python bench/compiler_peak.py --model keras-transformer --budget 428MiB --top 30
    python bench/compiler_peak.py --budget hand --model nnx-transformer --model penzai-llama \
        --out bench/results          # compiler-peak-hand.md: the peaks of several models
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable

_DUMP = tempfile.mkdtemp(prefix="autoremat-dump-")
# XLA reads its flags when the backend starts, before anything below is imported; a
# cached measurement would compile nothing.
os.environ.pop("AUTOREMAT_MEASURE_CACHE", None)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_dump_to={_DUMP} --xla_dump_hlo_module_re=.*loss.*")

import autoremat_ilp as ilp  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from autoremat_ilp.memory import reserved_peaks  # noqa: E402
from autoremat_ilp.problem import NO_CAP  # noqa: E402

import autoremat  # noqa: E402
from autoremat import _cli, _solve, zoo  # noqa: E402
from autoremat._benchmark import versions  # noqa: E402
from autoremat._budget import format_bytes  # noqa: E402

CORPUS = _cli._load_corpus(pathlib.Path(__file__).parent / "corpus")


def _one(pattern: str) -> str:
    (path,) = pathlib.Path(_DUMP).glob(pattern)
    return path.read_text()


#: What made a temporary: the forward pass (saved values among them), the backward pass
#: recomputing the forward (JAX's ``rematted_computation``) or computing gradients, or an
#: operation the dump names no source of (the compiler's own copies among them).
KINDS = ("forward", "recomputed", "gradients", "unnamed")


def _kind(op_name: str | None) -> str:
    """Which of :data:`KINDS` made a temporary, by its operation's JAX name."""
    if op_name is None:
        return "unnamed"
    if "transpose(" not in op_name:
        return "forward"
    return "recomputed" if "rematted_computation" in op_name else "gradients"


def peak_buffers(top: int) -> tuple[int, dict[str, int], list[str]]:
    """The bytes of temporaries live at the peak of the dumped step, those bytes by what
    made them (:data:`KINDS`), and lines for the temporaries, largest first."""
    assignment = _one("*after_optimizations-buffer-assignment.txt")
    ranges_text = _one("*after_optimizations-live-range.txt")
    hlo = _one("*after_optimizations.txt")
    temp = max((a for a in re.split(r"\n(?=allocation \d+:)", assignment)
                if "preallocated-temp" in a.split("\n")[0]),
               key=lambda a: int(re.search(r"size (\d+)", a)[1]))
    values = [(n if "{" in n else n + "{}", int(s), int(o)) for n, s, o in
              re.findall(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", temp)]
    ranges = {k: tuple(map(int, v.split("-"))) for k, v in
              re.findall(r"^\s+(\S+\{[\d,]*\}):(\d+-\d+)$", ranges_text, re.M)}
    ops = {m[1]: m[2] for m in re.finditer(
        r"^\s+(?:ROOT )?%(\S+) = .*?op_name=\"([^\"]*)\"", hlo, re.M)}
    steps = 1 + max((b for _, b in ranges.values()), default=0)
    live = [0] * steps
    for name, size, _ in set(values):
        if name in ranges:
            for t in range(ranges[name][0], ranges[name][1] + 1):
                live[t] += size
    peak = max(range(steps), key=live.__getitem__)
    at_peak = sorted(((s, n) for n, s, _ in set(values)
                      if n in ranges and ranges[n][0] <= peak <= ranges[n][1]), reverse=True)
    kinds = dict.fromkeys(KINDS, 0)
    for s, n in at_peak:
        kinds[_kind(ops.get(n.split("{")[0]))] += s
    lines = [f"temporaries live at step {peak} of {steps}: {live[peak] / 2**20:.1f} MiB "
             f"(the heap: {max(o + s for _, s, o in values) / 2**20:.1f} MiB); by what made "
             "them: " + ", ".join(f"{k} {b / 2**20:.1f}" for k, b in kinds.items())]
    lines += [f"  {s / 2**20:9.2f} MiB  {n:40s} {ranges[n][0]:5d}-{ranges[n][1]:<5d} "
              f"{ops.get(n.split('{')[0], '?')[-100:]}" for s, n in at_peak[:top]]
    return live[peak], kinds, lines


def output_sharing() -> str:
    """A line on the temporaries the compiler put in the outputs' buffers: how many
    buffers hold any, and how many at an offset other than the start (the memory model
    takes one value at a time per buffer, at its start)."""
    assignment = _one("*after_optimizations-buffer-assignment.txt")
    outputs = [a for a in re.split(r"\n(?=allocation \d+:)", assignment)
               if "maybe-live-out" in a.split("\n")[0]]
    hosting = offset = 0
    for a in outputs:
        values = set(re.findall(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", a))
        hosting += len(values) > 1
        offset += sum(o != "0" for _, _, o in values)
    return (f"output buffers {len(outputs)}: {hosting} also hold temporaries, "
            f"{offset} values at an offset other than 0")


def model_peak(plan: autoremat.Plan) -> str:
    """A line on the memory model's peak stage: the region, backward or forward, and the
    bound that sets it (the plain one, or a gradient-buffer bound and its cap)."""
    problem = _solve.problem_of(plan.graph)
    ids = plan.graph.array("id")
    save, recompute = np.isin(ids, list(plan.saved)), np.isin(ids, list(plan.recomputed))
    stages = ilp.stage_bytes(problem, save, recompute)
    R = problem.num_regions
    k = int(np.argmax(stages))
    peaks = reserved_peaks(problem, save, recompute)
    caps = problem.reserved_cap if problem.reserved_cap is not None else [None] * len(peaks)
    setting = [(b, c) for b, (p, c) in enumerate(zip(peaks, caps, strict=True))
               if p == stages[k]]
    bound = "the plain bound"
    if setting:
        b, cap = setting[0]
        capped = cap is not None and cap < NO_CAP
        limit = f"each value and buffer capped at {format_bytes(int(cap or 0))}"
        bound = f"gradient-buffer bound {b}, " + (limit if capped else "no cap")
    return (f"model peak {format_bytes(int(stages[k]))} at region {k % R} of {R}, "
            f"{'backward' if k < R else 'forward'}: {bound}")


def step_of(m: zoo.ZooModel, budget: str) -> Callable:
    """The step of model ``m`` at ``budget`` (``none``, ``hand`` or a plan's budget); a
    plan's report is printed."""
    if budget == "hand":
        return m.make_loss(jax.checkpoint_policies.nothing_saveable)
    loss = m.make_loss()
    if budget == "none":
        return loss
    plan = autoremat.plan(loss, m.param_shapes(), m.batch_shapes(), budget=budget)
    print(plan.report())
    print(model_peak(plan))
    return plan.apply(loss)


def measure(name: str, budget: str, target: str, top: int) -> dict:
    """Compiles model ``name``'s step at ``budget`` with the dumps on, prints what its
    peak holds, and returns it as a row of bytes."""
    shutil.rmtree(_DUMP)  # the dumps of the model before
    m = CORPUS[name] if name in CORPUS else zoo.get(name)
    real = autoremat.measure_step(step_of(m, budget), m.param_shapes(), m.batch_shapes(),
                                  target=target)
    print(f"{name}: compiler peak {real.peak_bytes / 2**20:.1f} MiB: arguments "
          f"{real.argument_bytes / 2**20:.1f}, outputs {real.output_bytes / 2**20:.1f}, "
          f"temporaries {real.temp_bytes / 2**20:.1f}")
    print(output_sharing())
    live, by_kind, lines = peak_buffers(top)
    # The compiler's peak counts the temporaries live at once, not the heap they are
    # packed in: arguments + outputs + live temporaries is its peak, but for values one
    # instruction hands to the next, which the live ranges count twice.
    print(f"arguments + outputs + live temporaries: "
          f"{(real.argument_bytes + real.output_bytes + live) / 2**20:.1f} MiB")
    print("\n".join(lines), flush=True)
    return {"model": name, "budget": budget, "peak": real.peak_bytes,
            "arguments": real.argument_bytes, "outputs": real.output_bytes,
            "live_temporaries": live, **by_kind}


def write_table(rows: list[dict], out: pathlib.Path, target: str) -> None:
    """``compiler-peak-<budget>.md`` and ``.json`` in ``out``: each model's peak split
    into arguments, outputs and the temporaries live at it, by what made them."""
    budget, command = rows[0]["budget"], shlex.join(["python", *sys.argv])
    mib = lambda b: f"{b / 2**20:.1f}"
    lines = [f"# What the compiler holds at the peak ({target}, budget {budget})", "",
             f"Made with `{command}`; versions "
             f"{json.dumps(versions())}. Per model: the compiler's peak and its arguments and "
             "outputs (counted whole for the whole step), then the temporaries live at the "
             "peak instruction of the compiler's schedule (MiB), by what made them: the "
             "forward pass (the values saved for the backward among them), the backward "
             "pass recomputing the forward (JAX's `rematted_computation`) or computing "
             "gradients, and operations the dump names no source of (the compiler's own "
             "copies among them). The last column is the arguments, outputs and gradient "
             "temporaries as a share of the peak: what remat does not decide (a plan "
             "decides what is saved and what is recomputed, and when).", "",
             "| model | peak MiB | arguments | outputs | temporaries at the peak | forward "
             "| recomputed | gradients | unnamed | arguments, outputs, gradients of the peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {mib(r['peak'])} | {mib(r['arguments'])} | "
              f"{mib(r['outputs'])} | {mib(r['live_temporaries'])} | "
              + " | ".join(mib(r[k]) for k in KINDS) + " | "
              f"{(r['arguments'] + r['outputs'] + r['gradients']) / r['peak']:.1%} |"
              for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"compiler-peak-{budget}.md").write_text("\n".join(lines) + "\n")
    (out / f"compiler-peak-{budget}.json").write_text(json.dumps(
        {"command": command, "versions": versions(), "rows": rows},
        indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, action="append",
                        choices=sorted({*CORPUS, *zoo.ZOO}))
    parser.add_argument("--budget", default="floor",
                        help="a budget, none (no plan) or hand (the hand baseline)")
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", type=pathlib.Path, help="write the table here")
    args = parser.parse_args()
    rows = [measure(name, args.budget, args.target, args.top) for name in args.model]
    if args.out:
        write_table(rows, args.out, args.target)


if __name__ == "__main__":
    main()
