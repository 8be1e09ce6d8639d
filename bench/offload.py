"""Three-way plans (keep, offload to host, recompute) against recompute-only plans.

Model only: each zoo model is traced from shapes and planned at budgets from its
recompute-only floor up; for each budget the script prints the recompute-only plan's
overhead and the three-way plan's modelled overhead (recompute FLOPs plus the transfer
time the step cannot hide, as FLOPs at the target's peak rate; see
``autoremat.OffloadConfig``), and how much it offloads. Nothing is compiled.

    python bench/offload.py                                  # gpt2-small, tpu-v5e
    python bench/offload.py --model gpt2-small-scan --overlap 0.9 --regions scan
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import autoremat
from autoremat import zoo
from autoremat._budget import format_bytes


def sweep(model: str, budgets: list[float | str], config: autoremat.OffloadConfig,
          time_limit_s: float) -> list[dict]:
    """Plans ``model`` at each budget (a fraction or bytes with a unit) with and without
    offload."""
    m = zoo.get(model)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    rows = []
    for budget in budgets:
        row: dict = {"budget": budget}
        for name, kwargs in (("recompute", {}), ("three_way", {"offload": config})):
            start = time.perf_counter()
            try:
                p = autoremat.plan(loss, *args, budget=budget, time_limit_s=time_limit_s,
                                   **kwargs)
            except autoremat.InfeasibleBudgetError as e:
                row[name] = {"infeasible": True, "floor_bytes": e.floor_bytes}
                continue
            row["budget_bytes"] = p.budget_bytes
            row[name] = {"peak_bytes": p.peak_bytes, "overhead": p.overhead,
                         "modeled_overhead": p.modeled_overhead,
                         "offloaded_bytes": p.offloaded_bytes, "status": p.status,
                         "seconds": time.perf_counter() - start}
        rows.append(row)
    return rows


def _cell(r: dict, key: str) -> str:
    if r.get("infeasible"):
        return f"infeasible (floor {format_bytes(r['floor_bytes'])})"
    return f"{100 * r[key]:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--target", default="tpu-v5e")
    parser.add_argument("--overlap", type=float, default=0.5)
    parser.add_argument("--regions", default="all", choices=["all", "scan"])
    parser.add_argument("--host-budget", default="64GiB")
    parser.add_argument("--budgets", default="1.2GiB,1.3GiB,1.4GiB,1.5GiB,0.1,0.2",
                        help="comma-separated fractions of the no-remat activations, or "
                        "bytes with a unit")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    a = parser.parse_args()
    config = autoremat.OffloadConfig(host_budget=a.host_budget, target=a.target,
                                     overlap=a.overlap, regions=a.regions)
    budgets = [b if any(ch.isalpha() for ch in b) else float(b) for b in a.budgets.split(",")]
    rows = sweep(a.model, budgets, config, a.time_limit)
    print(f"{a.model}, {a.target}: host bandwidth {config.flops_per_byte:.0f} "
          f"FLOP-equivalent per offloaded byte (overlap {a.overlap}, regions {a.regions})")
    print(f"{'asked':>8} {'budget':>11} {'recompute-only':>30} {'three-way':>12} "
          f"{'(recompute)':>12} {'offloaded':>11}")
    for row in rows:
        rc, tw = row["recompute"], row["three_way"]
        budget = format_bytes(row["budget_bytes"]) if "budget_bytes" in row else "-"
        off = "-" if tw.get("infeasible") else format_bytes(tw["offloaded_bytes"])
        rec = "-" if tw.get("infeasible") else f"{100 * tw['overhead']:.2f}%"
        print(f"{row['budget']:>8} {budget:>11} {_cell(rc, 'overhead'):>30} "
              f"{_cell(tw, 'modeled_overhead'):>12} {rec:>12} {off:>11}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
