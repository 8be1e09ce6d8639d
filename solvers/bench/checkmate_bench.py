"""Runs every solver on the Checkmate benchmark graphs and replays each schedule.

For each graph: the checkpoint-all peak (free after last use), the memory floor (the
largest node output plus its inputs), and budgets at the floor and 25/50/75% of the way
from the floor to the checkpoint-all peak. Every solver result is replayed by the
simulator; the table reports the simulated cost, its overhead over computing every node
once, the gap to the best proven lower bound (the MILP's bound, or the LP relaxation's
optimum when it is higher, e.g. when the MILP ran out of time), the wall time and the
simulator's verdict.

Usage:
  PYTHONPATH=solvers python solvers/bench/checkmate_bench.py --graphs VGG16 MobileNet \
      --time-limit 60 --out /tmp/checkmate_bench
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from autoremat_solvers import SOLVERS, load_graph_json, simulate

DEFAULT_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "checkmate-graphs"
FRACTIONS = (0.0, 0.25, 0.5, 0.75)


def _run_graph(path: pathlib.Path, solvers: list[str], time_limit_s: float) -> list[dict]:
    graph = load_graph_json(path)
    all_sched = SOLVERS["checkpoint_all"](graph, math.inf).schedule
    peak_all = simulate(graph, all_sched, math.inf).peak_ram
    floor = graph.memory_floor()
    rows = []
    for frac in FRACTIONS:
        budget = floor + frac * (peak_all - floor)
        results = {name: SOLVERS[name](graph, budget, time_limit_s) for name in solvers}
        # Both are lower bounds on the cost of any schedule in Checkmate's model at this budget.
        bounds = [results[k].lower_bound for k in ("checkmate_milp", "checkmate_lp_rounding") if k in results]
        bound = max([b for b in bounds if math.isfinite(b)], default=math.nan)
        for name, res in results.items():
            sim = simulate(graph, res.schedule, budget) if res.schedule is not None else None
            cost = sim.cost if sim is not None else math.nan
            gap = (cost - bound) / bound if sim is not None and bound > 0 else math.nan
            rows.append(
                {
                    "graph": path.stem,
                    "n": graph.n,
                    "budget_frac": frac,
                    "budget_bytes": budget,
                    "budget_of_peak": budget / peak_all,
                    "solver": name,
                    "status": res.status.value,
                    "claimed_cost": res.claimed_cost,
                    "sim_cost": cost,
                    "overhead": cost / graph.total_cost - 1 if sim is not None else math.nan,
                    "lower_bound": res.lower_bound,
                    "best_bound": bound,
                    "gap_to_best_bound": gap,
                    "wall_s": res.wall_s,
                    "sim_ok": None if sim is None else sim.ok,
                    "sim_peak": None if sim is None else sim.peak_ram,
                    "violations": [] if sim is None else list(sim.violations),
                }
            )
            print(_md_row(rows[-1]), flush=True)
    return rows


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


_HEADER = (
    "| graph | n | budget (floor + x of range) | budget / ckpt-all peak | solver | status | sim cost "
    "| overhead | gap to bound | wall s | simulator |\n|" + "---|" * 11
)


def _md_row(r: dict) -> str:
    verdict = "-" if r["sim_ok"] is None else ("ok" if r["sim_ok"] else "REJECTED")
    return (
        f"| {r['graph']} | {r['n']} | {r['budget_frac']:.2f} | {r['budget_of_peak']:.3f} | {r['solver']} "
        f"| {r['status']} | {_fmt(r['sim_cost'], '.0f')} | {_fmt(r['overhead'], '.1%')} "
        f"| {_fmt(r['gap_to_best_bound'], '.2%')} | {r['wall_s']:.1f} | {verdict} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph-dir", type=pathlib.Path, default=DEFAULT_DIR)
    parser.add_argument("--graphs", nargs="*", default=None, help="substrings of file names (default: all *_train_nx)")
    parser.add_argument("--solvers", nargs="*", default=list(SOLVERS), choices=list(SOLVERS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver call")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("checkmate_bench_out"))
    args = parser.parse_args(argv)
    if not args.graph_dir.is_dir():
        print(f"graph directory {args.graph_dir} is absent; nothing to benchmark")
        return 0
    paths = sorted(args.graph_dir.glob("*.json"))
    if args.graphs:
        paths = [p for p in paths if any(s in p.name for s in args.graphs) and "_test_nx" not in p.name]
    else:
        paths = [p for p in paths if p.name.endswith("_train_nx.json")]
    print(_HEADER)
    rows = [row for path in paths for row in _run_graph(path, args.solvers, args.time_limit)]
    args.out.mkdir(parents=True, exist_ok=True)
    finite = [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows]
    (args.out / "results.json").write_text(json.dumps(finite, indent=1))
    (args.out / "results.md").write_text(_HEADER + "\n" + "\n".join(_md_row(r) for r in rows) + "\n")
    print(f"wrote {args.out / 'results.md'} and {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
