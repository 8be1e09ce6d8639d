"""One remat per layer (the plan a user writes by hand) against the library's own.

For each corpus model: the compiler's peak of the hand baseline (every block in its
library's own remat with ``nothing_saveable``), and of autoremat's two per-layer plans
(:func:`autoremat._planner._candidates.per_layer_plan`: the code around the layers in a
checkpoint too, or as written; both among the plans a verified floor is the lowest of)
with their modelled peaks, ahead of time for the target. Writes ``per-layer.md`` and
``per-layer.json``.

    pip install -e ".[tpu,corpus]"
    python bench/per_layer.py --out bench/results       # every full-size corpus model
    python bench/per_layer.py --model linen-encoder --out /tmp/pl
"""

from __future__ import annotations

import argparse
import json
import pathlib

import autoremat
from autoremat import _cli, _rewrite
from autoremat._benchmark import BUILTIN_POLICIES, versions
from autoremat._planner._candidates import candidates, obvious_plans
from autoremat._planner._options import PlanOptions

CORPUS = _cli._load_corpus(pathlib.Path(__file__).parent / "corpus")


def measure(name: str, target: str) -> dict:
    """The hand baseline's compiler peak, and the per-layer plans', modelled and compiled."""
    m = CORPUS[name]
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    options = PlanOptions(verify=None)
    _, rematted, written = obvious_plans(candidates(flat_fn, avals, options), options)
    hand = m.make_loss(BUILTIN_POLICIES["nothing_saveable"])
    row = {"model": name,
           "hand_bytes": autoremat.measure_step(hand, *args, target=target).peak_bytes}
    for key, plan in (("rematted", rematted), ("written", written)):
        row[key] = {"compiler_bytes": autoremat.measure_step(
                        plan.apply(loss), *args, target=target).peak_bytes,
                    "predicted_bytes": plan.peak_bytes,
                    "as_written_regions": list(plan.placement.written)}
    print(f"{name}: hand {row['hand_bytes'] / 2**20:.1f} MiB, per layer "
          f"{row['rematted']['compiler_bytes'] / 2**20:.1f} MiB, with the code around as "
          f"written {row['written']['compiler_bytes'] / 2**20:.1f} MiB", flush=True)
    return row


def _table(rows: list[dict], target: str, command: str) -> str:
    lines = [
        f"# One remat per layer against the library's own, on {target}", "",
        f"Made with `{command}`; versions: {json.dumps(versions())}. Per corpus model: the "
        "compiler's peak with every block in its library's own remat and `nothing_saveable` "
        "(hand), and of autoremat's two per-layer plans (one checkpoint per layer found from "
        "the program's repetition, keeping only its input), the code around the layers "
        "(embedding, head, loss) in a checkpoint too, or run as written as the library's "
        "remat leaves it; each against hand, and the model's figure for it (predicted).", "",
        "| model | hand MiB | per layer MiB | vs hand | predicted MiB | around as written MiB "
        "| vs hand | predicted MiB | regions as written |", "|---|---|---|---|---|---|---|---|---|"]
    mib = lambda b: f"{b / 2**20:.1f}"
    for r in rows:
        cells = [r["model"], mib(r["hand_bytes"])]
        for key in ("rematted", "written"):
            real = r[key]["compiler_bytes"]
            cells += [mib(real), f"{real - r['hand_bytes']:+d} B "
                      f"({real / r['hand_bytes'] - 1:+.2%})", mib(r[key]["predicted_bytes"])]
        cells.append(", ".join(map(str, r["written"]["as_written_regions"])) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(CORPUS))
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    a = parser.parse_args()
    names = a.model or sorted(n for n in CORPUS if not n.endswith("-tiny"))
    rows = [measure(n, a.target) for n in names]
    command = "python bench/per_layer.py" + "".join(f" --model {n}" for n in a.model or ())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "per-layer.md").write_text(_table(rows, a.target, command + f" --out {a.out}"))
    (a.out / "per-layer.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
