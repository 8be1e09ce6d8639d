"""The floor: autoremat's ``budget="floor"`` plan against ``nothing_saveable`` per layer,
both compiled for a TPU target, as the issues on the benchmark and on placement ask
(autoremat's floor no higher than ``nothing_saveable``'s), on zoo and corpus models.

    python bench/floor.py --model gpt2-small --model gpt2-small-scan --model llama
    python bench/floor.py --model eqx-mlp --out /tmp/floor       # pip install -e ".[corpus]"

Writes ``floor.md`` and ``floor.json`` under ``--out``. Each row: the step's arguments and
outputs (the device memory no plan goes below), the real peak without remat, then for
``nothing_saveable`` and autoremat's floor, without and with ``verify``, the real peak
(``Measurement.peak_bytes``; the JSON also has the compiler's own
``peak_memory_in_bytes``), the plan's number of remat regions (and whether the verified
floor nests them) and the program's recompute overhead (FLOPs of the training step's jaxpr
over no remat's); the JSON also has the verified floor's compiles.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import shlex
import sys

import autoremat
from autoremat import _cli, _measure, zoo
from autoremat._benchmark import BUILTIN_POLICIES, program_flops, versions


@functools.cache
def corpus() -> dict[str, zoo.ZooModel]:
    """The corpus models, imported only when one is asked for (a zoo model needs none of
    the corpus's libraries)."""
    return _cli._load_corpus(pathlib.Path(__file__).parent / "corpus")


def measure(name: str, target: str, time_limit_s: float) -> dict:
    """``nothing_saveable``'s and the floor plan's real peak and overhead for one model."""
    model = zoo.get(name) if name in zoo.ZOO else corpus()[name]
    args = (model.param_shapes(), model.batch_shapes())
    loss = model.make_loss()
    argnums = _measure.float_argnums(args)
    base = program_flops(loss, *args, argnums=argnums)
    baseline = model.make_loss(BUILTIN_POLICIES["nothing_saveable"])
    # verify=None: the model's floor, also on a TPU host, where verify defaults to the chip.
    floor = autoremat.plan(loss, *args, budget="floor", time_limit_s=time_limit_s, verify=None)
    verified = autoremat.plan(loss, *args, budget="floor", time_limit_s=time_limit_s,
                              verify=target)
    row = {"model": name, "target": target, "floor_predicted_bytes": floor.peak_bytes,
           "floor_status": floor.status, "floor_scan_pieces": floor.placement.scan_pieces,
           "floor_regions": len(floor.graph.regions),
           "verified_predicted_bytes": verified.peak_bytes,
           "verified_scan_pieces": verified.placement.scan_pieces,
           "verified_regions": len(verified.graph.regions),
           "verified_nests": verified.placement.nests,
           "verified_compiles": verified.verify_compiles}
    for key, fn in (("no_remat", loss), ("nothing_saveable", baseline),
                    ("floor", floor.apply(loss)),
                    ("verified", verified.apply(loss))):
        real = _measure.measure_step(fn, *args, target=target, argnums=argnums)
        # What no plan goes below: the step's arguments and outputs (the same for each).
        row.setdefault("arguments_outputs_bytes", real.argument_bytes + real.output_bytes)
        row[f"{key}_real_bytes"] = real.peak_bytes
        row[f"{key}_compiler_peak_bytes"] = real.compiler_peak_bytes
        row[f"{key}_overhead"] = program_flops(fn, *args, argnums=argnums) / base - 1
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a zoo or corpus model's name")
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args()
    rows = [measure(m, args.target, args.time_limit)
            for m in args.model or ["gpt2-small", "gpt2-small-scan", "llama"]]
    command = shlex.join(["python", *sys.argv])
    mib = lambda b: f"{b / 2**20:.1f}"
    lines = [
        "# The floor against nothing_saveable", "",
        (f"Made with `{command}`; versions {json.dumps(versions())}. `budget=\"floor\"`: the "
         "least peak the model allows, then the least stage peak with no saved value packed "
         "into the gradients' buffers, then the least recompute; with `verify`, the plan "
         "the compiler puts lowest among the floor plans of the placements whose model floor "
         "is within 10% of the least, likewise of the nested placements, no remat and one "
         "remat per layer. Program overhead: "
         "FLOPs of the training step's jaxpr over no remat's."), "",
        ("| model | arguments + outputs MiB | no remat MiB | nothing_saveable MiB | overhead "
         "| floor plan MiB (predicted) | overhead | regions | with verify MiB (predicted) "
         "| overhead | regions | with verify - nothing_saveable |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {mib(r['arguments_outputs_bytes'])} | "
              f"{mib(r['no_remat_real_bytes'])} | "
              f"{mib(r['nothing_saveable_real_bytes'])} | "
              f"{r['nothing_saveable_overhead']:+.2%} | {mib(r['floor_real_bytes'])} "
              f"({mib(r['floor_predicted_bytes'])}) | {r['floor_overhead']:+.2%} | "
              f"{r['floor_regions']} | "
              f"{mib(r['verified_real_bytes'])} ({mib(r['verified_predicted_bytes'])}) | "
              f"{r['verified_overhead']:+.2%} | {r['verified_regions']}"
              f"{' nested' if r['verified_nests'] else ''} | "
              f"{mib(r['verified_real_bytes'] - r['nothing_saveable_real_bytes'])} MiB |"
              for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "floor.md").write_text("\n".join(lines) + "\n")
    (args.out / "floor.json").write_text(json.dumps(
        {"command": command, "versions": versions(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
