"""The analytic memory model against the TPU compiler across the zoo.

For each model, plans at three budgets (the analytic floor, and 1/3 and 2/3 of the way
from it to the no-remat peak), without the closed loop, and compiles each planned step
ahead of time for the target: predicted peak, compiler peak, error. Writes a markdown
table beside the other results.

    pip install -e ".[tpu]"
    python bench/accuracy.py --model mlp --model resnet --model unet --out bench/results
"""

from __future__ import annotations

import argparse
import json
import pathlib

import autoremat
from autoremat import _measure, zoo
from autoremat._benchmark import floor_bytes, versions
from autoremat._layout import LAYOUTS


def measure(model: str, target: str, time_limit_s: float, layout: str) -> list[dict]:
    """Predicted and compiler peaks of ``model``'s plans at three budgets, planned with
    ``layout``."""
    m = zoo.get(model)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    floor = floor_bytes(loss, *args, layout=layout)
    top = autoremat.plan(loss, *args, budget=1.0, time_limit_s=time_limit_s,
                         layout=layout).peak_bytes
    rows = []
    for k in range(3):
        budget = floor + k * (top - floor) // 3
        p = autoremat.plan(loss, *args, budget=budget, time_limit_s=time_limit_s,
                           layout=layout)
        real = autoremat.measure_step(p.apply(loss), *args, target=target).peak_bytes
        rows.append({"model": model, "budget_bytes": budget, "predicted_peak_bytes": p.peak_bytes,
                     "real_peak_bytes": real, "error": p.peak_bytes / real - 1,
                     "regions": len(p.placement.cuts) + 1, "overhead": p.overhead})
        print(f"{model} budget {budget / 2**20:.0f} MiB: predicted {p.peak_bytes / 2**20:.0f} "
              f"MiB, compiler {real / 2**20:.0f} MiB, error {rows[-1]['error']:+.1%}", flush=True)
    return rows


def floor_and_thirds(name: str, **options) -> list[tuple[str, autoremat.Plan, int]]:
    """``(point, plan, compiler peak bytes)`` of the zoo or corpus model ``name`` planned
    without the closed loop at ``budget="floor"`` and 1/3 and 2/3 of the way from that plan's
    peak to the no-remat peak, each with ``options`` (``plan``'s keywords); compiled for
    TPU v5e. The evidence scripts under ``bench/results/`` compare the model with it."""
    from bench import corpus

    m = corpus.CORPUS.get(name) or zoo.get(name)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    floor = autoremat.plan(loss, *args, budget="floor", **options)
    top = floor.no_remat_peak_bytes
    points = [("floor", floor)]
    for frac in (1 / 3, 2 / 3):
        budget = int(floor.peak_bytes + frac * (top - floor.peak_bytes))
        points.append((f"{frac:.2f}", autoremat.plan(loss, *args, budget=budget, **options)))
    return [(point, p, autoremat.measure_step(p.apply(loss), *args, target="tpu-v5e",
                                              argnums=_measure.float_argnums(args)).peak_bytes)
            for point, p in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, choices=sorted(zoo.ZOO))
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--layout", default="dense", choices=LAYOUTS)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args()
    rows = [r for name in args.model
            for r in measure(name, args.target, args.time_limit, args.layout)]
    lines = ["| model | budget MiB | regions | predicted MiB | compiler MiB | error |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['budget_bytes'] / 2**20:.0f} | {r['regions']} | "
              f"{r['predicted_peak_bytes'] / 2**20:.0f} | {r['real_peak_bytes'] / 2**20:.0f} | "
              f"{r['error']:+.1%} |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.md").write_text(
        f"# Analytic model vs {args.target} compiler\n\nMade with `python bench/accuracy.py "
        + " ".join(f"--model {m}" for m in args.model)
        + f" --target {args.target} --layout {args.layout}`; "
        f"versions {json.dumps(versions())}.\n\n" + "\n".join(lines) + "\n")
    (args.out / "accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
