"""Predicted versus real peak memory of GPT-2-small training steps, on TPU v5e ahead of time.

Compiles ``jax.grad`` of the GPT-2-small loss (12 unrolled layers, bf16, batch 8, seq 1024)
with the real TPU compiler (``libtpu``, no TPU needed) for: no checkpoint; a
``jax.checkpoint`` around every layer with two standard policies; and autoremat plans at
a few budgets, whose predicted peak (``Plan.peak_bytes``) is set against the compiler's.
Prints a markdown table and writes it, with versions and the command, as JSON.

Run from the repository root (needs ``pip install -e ".[tpu]"``; 6-8 compiles of 10-80 s)::

    python bench/measure_gpt2.py --json measure_gpt2.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import platform
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

import autoremat
from autoremat import _measure
from autoremat.zoo import gpt2

MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured variant; ``predicted_*`` are None for hand-written policies."""

    name: str
    real_peak_bytes: int
    real_temp_bytes: int
    real_gflop: float
    real_overhead: float
    compile_seconds: float
    predicted_peak_bytes: int | None = None
    predicted_gflop: float | None = None
    predicted_overhead: float | None = None
    plan_status: str | None = None
    plan_seconds: float | None = None

    @property
    def ratio(self) -> float | None:
        """Predicted peak over real peak."""
        return None if self.predicted_peak_bytes is None else (
            self.predicted_peak_bytes / self.real_peak_bytes)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row]) -> str:
    """The rows as a markdown table."""
    lines = [("| variant | predicted peak MiB | real peak MiB | predicted/real | "
              "predicted GFLOP | real GFLOP | predicted overhead | real overhead | compile s |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = None if r.predicted_peak_bytes is None else r.predicted_peak_bytes / MIB
        lines.append(
            f"| {r.name} | {_fmt(pred, '.0f')} | {r.real_peak_bytes / MIB:.0f} | "
            f"{_fmt(r.ratio, '.2f')} | {_fmt(r.predicted_gflop, '.0f')} | {r.real_gflop:.0f} | "
            f"{_fmt(r.predicted_overhead, '+.1%')} | {r.real_overhead:+.1%} | "
            f"{r.compile_seconds:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="tpu-v5e", choices=sorted(_measure.TPU_TOPOLOGIES))
    parser.add_argument("--budgets", nargs="*", default=["3GiB", "4GiB", "6GiB"])
    parser.add_argument("--json", default="measure_gpt2.json", help="where to write results")
    opts = parser.parse_args()

    c = gpt2.GPT2_SMALL
    args: tuple[Any, ...] = (gpt2.param_shapes(c), gpt2.batch_shapes(c))
    loss = gpt2.make_loss(c)
    rows: list[Row] = []

    def measure(name: str, fn: Callable, plan: autoremat.Plan | None = None,
                plan_seconds: float | None = None, predicted_peak: int | None = None) -> None:
        m = _measure.measure_step(fn, *args, target=opts.target)
        base = rows[0].real_gflop * 1e9 if rows else m.flops
        row = Row(name=name, real_peak_bytes=m.peak_bytes, real_temp_bytes=m.temp_bytes,
                  real_gflop=m.flops / 1e9, real_overhead=m.flops / base - 1,
                  compile_seconds=m.compile_seconds)
        if plan is not None:
            row = dataclasses.replace(
                row, predicted_peak_bytes=predicted_peak or plan.peak_bytes,
                predicted_gflop=(plan.step_flops + plan.recompute_flops) / 1e9,
                predicted_overhead=plan.overhead, plan_status=plan.status,
                plan_seconds=plan_seconds)
        rows.append(row)
        print(f"{name}: {row}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    full = autoremat.plan(loss, *args, budget=1.0)
    full_seconds = time.perf_counter() - start
    # The plan that saves everything it may also predicts the step without checkpoints:
    # its recompute is zero or nearly (only free reads).
    measure("no checkpoint", loss, full, full_seconds, predicted_peak=full.no_remat_peak_bytes)
    measure("autoremat budget=1.0 (save all)", full.apply(loss), full, full_seconds)
    for name in ("nothing_saveable", "dots_with_no_batch_dims_saveable"):
        policy = getattr(jax.checkpoint_policies, name)
        measure(f"per-layer {name}", gpt2.make_loss(c, layer_policy=policy))
    for budget in opts.budgets:
        start = time.perf_counter()
        plan = autoremat.plan(loss, *args, budget=budget)
        measure(f"autoremat budget={budget}", plan.apply(loss), plan,
                time.perf_counter() - start)

    print(table(rows))
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": opts.target,
        "topology": _measure.TPU_TOPOLOGIES[opts.target],
        "model": {k: str(v) for k, v in dataclasses.asdict(c).items()},
        "versions": {"python": platform.python_version(), "jax": jax.__version__,
                     "jaxlib": importlib.metadata.version("jaxlib"),
                     "libtpu": importlib.metadata.version("libtpu")},
        "rows": [{**dataclasses.asdict(r), "predicted_over_real": r.ratio} for r in rows],
        "table": table(rows),
    }
    with open(opts.json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
