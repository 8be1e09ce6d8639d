"""Planning time: wall seconds of :func:`autoremat.plan` (trace, every placement, solve) on
Llama-style models, scanned and unrolled, as the issue on placement asks.

Each model is planned at budgets given as fractions of its no-remat activation memory,
``--runs`` times each; the table gives the median wall time, the solver's status and gap,
and the size of the traced program (forward equations, and those of the training step
``jax.grad``). Run it on an otherwise idle machine: the figures are wall time.

    python bench/planning_time.py --out bench/results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shlex
import statistics
import sys
import time
from types import ModuleType
from typing import Any

import jax
import jax.extend.core as jex

import autoremat
from autoremat._benchmark import versions
from autoremat.zoo import gpt2, llama

MODELS: dict[str, tuple[ModuleType, Any]] = {  # the zoo module and its config
    "gpt2-small": (gpt2, gpt2.GPT2_SMALL),
    "gpt2-small-scan": (gpt2, dataclasses.replace(gpt2.GPT2_SMALL, scan_layers=True)),
    "llama": (llama, llama.LLAMA),
    "llama-24-unrolled": (llama, dataclasses.replace(llama.LLAMA_24, scan_layers=False)),
    "llama-80-unrolled": (llama, dataclasses.replace(llama.LLAMA, n_layer=80,
                                                     scan_layers=False)),
}


def equations(jaxpr: jex.Jaxpr) -> int:
    """Equations of ``jaxpr`` and of every jaxpr nested in it."""
    return sum(1 + sum(equations(s) for s in jex.jaxprs_in_params(e.params)) for e in jaxpr.eqns)


def time_model(name: str, budgets: list[float | str], runs: int, time_limit_s: float,
               backends: tuple[str, ...] | None = None) -> list[dict]:
    """One row per budget (a fraction, or bytes such as ``"2.3GiB"``): median wall seconds
    of ``runs`` plans (a plan the time limit left without one counts its wall time), with
    the solver ``backends`` (``None``: the default)."""
    module, config = MODELS[name]
    loss, args = module.make_loss(config), (module.param_shapes(config),
                                            module.batch_shapes(config))
    forward = equations(jax.make_jaxpr(loss)(*args).jaxpr)
    step = equations(jax.make_jaxpr(jax.grad(loss))(*args).jaxpr)
    chosen = {} if backends is None else {"backends": backends}
    rows = []
    for budget in budgets:
        walls, plans = [], []
        for _ in range(runs):
            start = time.perf_counter()
            try:
                plans.append(autoremat.plan(loss, *args, budget=budget,
                                            time_limit_s=time_limit_s, **chosen))
            except autoremat.SolverTimeoutError:
                pass
            except autoremat.InfeasibleBudgetError:
                plans.append(None)
            walls.append(time.perf_counter() - start)
        rows.append({"model": name, "forward_equations": forward, "step_equations": step,
                     "budget": budget, "time_limit_s": time_limit_s,
                     "backends": ",".join(backends or autoremat.PlanOptions().backends),
                     "wall_s": walls, "median_wall_s": statistics.median(walls),
                     **_outcome(plans, runs)})
        print(f"{name} at {budget} ({rows[-1]['backends']}): median "
              f"{rows[-1]['median_wall_s']:.1f} s of {walls}, {rows[-1]['status']} gap "
              f"{rows[-1]['gap']:.2%} overhead {rows[-1]['overhead']:.4%}", flush=True)
    return rows


def _outcome(plans: list[autoremat.Plan | None], runs: int) -> dict:
    """The last plan's figures, and whether every run gave the same plan (a run the time
    limit left without a plan: status ``"timeout"``; ``None``, a budget below the floor:
    ``"infeasible"``)."""
    if not plans or plans[-1] is None:
        return {"budget_bytes": None, "status": "infeasible" if plans else "timeout",
                "gap": math.inf, "overhead": math.nan, "same_plan_every_run": True}
    p = plans[-1]
    same = len(plans) == runs and len({(q.saved, q.placement.cuts, q.placement.scan_pieces)
                                       for q in plans if q is not None}) == 1
    return {"budget_bytes": p.budget_bytes, "status": p.status, "gap": p.gap,
            "overhead": p.overhead, "same_plan_every_run": same}


def _budget(r: dict) -> str:
    """A row's budget as the table shows it."""
    given = r["budget"] if isinstance(r["budget"], str) else f"{r['budget']:.2f}"
    return given if r["budget_bytes"] is None else f"{given} ({r['budget_bytes'] / 2**30:.2f} GiB)"


def merged(folders: list[pathlib.Path]) -> list[dict]:
    """The rows of runs made by separate processes (say, alternating with another library
    run by run), read from each folder's ``planning_time.json``: one row per model, budget
    and backends, its wall times all the runs', its figures the last run's; whether every
    run gave the same plan is then judged by its recompute overhead and status alone."""
    groups: dict[tuple, list[dict]] = {}
    for folder in folders:
        for r in json.loads((folder / "planning_time.json").read_text()):
            groups.setdefault((r["model"], str(r["budget"]), r["backends"]), []).append(r)
    rows = []
    for runs in groups.values():
        walls = [w for r in runs for w in r["wall_s"]]
        same = all(r["same_plan_every_run"] for r in runs) and len(
            {(r["status"], r["overhead"]) for r in runs}) == 1
        rows.append({**runs[-1], "wall_s": walls, "median_wall_s": statistics.median(walls),
                     "same_plan_every_run": same})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS))
    parser.add_argument("--fraction", type=float, action="append",
                        help="a budget as a fraction of the no-remat activation memory")
    parser.add_argument("--budget", action="append", help="a budget in bytes, e.g. 2.3GiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--time-limit", type=float, action="append",
                        help="per model, in --model order (default: 4 s scanned, 25 s unrolled)")
    parser.add_argument("--backends", action="append",
                        help="solver backends tried in turn, comma-separated (HIGHS,SCIP); "
                             "given more than once, each is timed (default: the library's)")
    parser.add_argument("--merge", type=pathlib.Path, action="append",
                        help="instead of timing, merge the runs in these output folders")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args()
    if args.merge:
        rows = merged(args.merge)
    else:
        names = args.model or list(MODELS)
        budgets = [*(args.fraction or []), *(args.budget or [])] or [0.1, 0.3]
        limits = args.time_limit or [4.0 if MODELS[n][1].scan_layers else 25.0 for n in names]
        portfolios = [tuple(b.split(",")) for b in args.backends] if args.backends else [None]
        rows = [r for n, t in zip(names, limits, strict=True) for b in portfolios
                for r in time_model(n, budgets, args.runs, t, b)]
    write(rows, args.out)


def write(rows: list[dict], out: pathlib.Path) -> None:
    """``planning_time.md`` and ``.json`` of ``rows`` in ``out``."""
    lines = [("| model | forward eqns | step eqns | budget (a fraction: of no-remat activations) "
              "| time limit s | backends "
              "| median wall s (runs) | status | gap | recompute overhead | same plan each run |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['forward_equations']} | {r['step_equations']} | "
              f"{_budget(r)} | "
              f"{r['time_limit_s']:.0f} | {r['backends']} | "
              f"{r['median_wall_s']:.1f} ({', '.join(f'{w:.1f}' for w in r['wall_s'])}) | "
              f"{r['status']} | "
              f"{r['gap']:.2%} | {r['overhead']:.2%} | {r['same_plan_every_run']} |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    header = ("# Planning time\n\nMade with "
              f"`python bench/planning_time.py {shlex.join(sys.argv[1:])}` "
              f"on {os.cpu_count()} cores; versions {json.dumps(versions())}. Wall time of "
              "`autoremat.plan` (trace, every placement, solve); the time limit bounds the whole "
              "call (tracing included).\n\n")
    (out / "planning_time.md").write_text(header + "\n".join(lines) + "\n")
    (out / "planning_time.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
