"""One remat per layer (the plan a user writes by hand) against the library's own.

For each corpus model: the compiler's peak of the hand baseline (every block in its
library's own remat with ``nothing_saveable``), and of autoremat's per-layer plan
(:func:`autoremat._planner._candidates.per_layer_plan`, one of the plans a verified floor
is the lowest of) with its modelled peak, ahead of time for the target. Writes
``per-layer.md`` and ``per-layer.json``.

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
    """The hand baseline's compiler peak, and the per-layer plan's, modelled and compiled."""
    m = CORPUS[name]
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    options = PlanOptions(verify=None)
    _, per_layer = obvious_plans(candidates(flat_fn, avals, options), options)
    assert per_layer.graph is not None  # a plan made here has its graph
    hand = m.make_loss(BUILTIN_POLICIES["nothing_saveable"])
    hand_bytes = autoremat.measure_step(hand, *args, target=target).peak_bytes
    real = autoremat.measure_step(per_layer.apply(loss), *args, target=target).peak_bytes
    row = {"model": name, "hand_bytes": hand_bytes, "per_layer_bytes": real,
           "predicted_bytes": per_layer.peak_bytes, "regions": len(per_layer.graph.regions),
           "as_written_regions": list(per_layer.placement.written)}
    print(f"{name}: hand {hand_bytes / 2**20:.1f} MiB, per layer {real / 2**20:.1f} MiB "
          f"({real / hand_bytes - 1:+.2%}), predicted {per_layer.peak_bytes / 2**20:.1f} MiB",
          flush=True)
    return row


def _table(rows: list[dict], target: str, command: str) -> str:
    lines = [
        f"# One remat per layer against the library's own, on {target}", "",
        f"Made with `{command}`; versions: {json.dumps(versions())}. Per corpus model: the "
        "compiler's peak with every block in its library's own remat and `nothing_saveable` "
        "(hand), and of autoremat's per-layer plan (one checkpoint per layer found from the "
        "program's repetition, keeping only its input; the code around the layers run as "
        "written), with the model's figure for it.", "",
        "| model | hand MiB | per layer MiB | per layer vs hand | predicted MiB | regions | "
        "as written |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mib = lambda b: f"{b / 2**20:.1f}"
        lines.append(
            f"| {r['model']} | {mib(r['hand_bytes'])} | {mib(r['per_layer_bytes'])} | "
            f"{r['per_layer_bytes'] - r['hand_bytes']:+d} B "
            f"({r['per_layer_bytes'] / r['hand_bytes'] - 1:+.2%}) | "
            f"{mib(r['predicted_bytes'])} | {r['regions']} | "
            f"{', '.join(map(str, r['as_written_regions'])) or '-'} |")
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
