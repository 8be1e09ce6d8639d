"""Runs every solver on the Checkmate benchmark graphs and replays each schedule.

Budgets per graph. The *proven floor* is the memory floor (a node's output plus its
inputs must fit). The *lowest found* budget is the smallest simulated peak of any
baseline schedule (in practice Griewank & Walther's), so every budget below has at
least one schedule. Budgets: the lowest found, 25/50/75% of the way from it to the
checkpoint-all peak (free after last use), and 80/90% of that peak when above the
lowest found. Every solver result is replayed by the simulator; the table reports the
simulated cost, its overhead over computing every node once, the gap to the best
proven lower bound under Checkmate's model (the MILP's bound, or the LP relaxation's
optimum when higher), the solver's status and wall time and the simulator's verdict.
``--exact GRAPH:POINT:SECONDS`` gives the Checkmate MILP a longer limit at one budget
point (e.g. ``ResNet50:p90:600``).

Usage:
  PYTHONPATH=solvers nice -n 10 python solvers/bench/checkmate_bench.py \
      --graphs VGG16 VGG19 MobileNet ResNet50 --time-limit 30 --exact ResNet50:p90:300 \
      --out solvers/bench/results
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import pathlib
import platform
import shlex
import sys

from autoremat_solvers import (
    BASELINES,
    SOLVERS,
    ComputeGraph,
    load_graph_json,
    simulate,
)

DEFAULT_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "checkmate-graphs"
SPAN_POINTS = (0.25, 0.5, 0.75)  # of the way from the lowest found budget to the checkpoint-all peak
PEAK_POINTS = (0.8, 0.9)  # of the checkpoint-all peak
# Lower bounds valid for any schedule in Checkmate's model (CP-SAT's holds only for its own).
BOUND_SOLVERS = ("checkmate_milp", "checkmate_lp_rounding")


def _budgets(graph: ComputeGraph) -> tuple[int, int, dict[str, float]]:
    """``(checkpoint-all peak, lowest found budget, {point name: budget})``."""
    peaks = [simulate(graph, BASELINES[name](graph, math.inf).schedule, math.inf).peak_ram for name in BASELINES]
    peak_all = simulate(graph, BASELINES["checkpoint_all"](graph, math.inf).schedule, math.inf).peak_ram
    lowest = min(peaks)
    points = {"lowest": float(lowest)}
    points.update({f"s{round(100 * x)}": lowest + x * (peak_all - lowest) for x in SPAN_POINTS})
    points.update({f"p{round(100 * x)}": x * peak_all for x in PEAK_POINTS if x * peak_all >= lowest})
    return peak_all, lowest, dict(sorted(points.items(), key=lambda kv: kv[1]))


def _run_graph(path: pathlib.Path, solvers: list[str], time_limit_s: float, exact: dict[tuple[str, str], float]
               ) -> list[dict]:
    graph = load_graph_json(path)
    name = path.name.split("__")[0]
    peak_all, lowest, points = _budgets(graph)
    rows = []
    for point, budget in points.items():
        results = {}
        for solver in solvers:
            limit = exact.get((name, point), time_limit_s) if solver == "checkmate_milp" else time_limit_s
            results[solver] = SOLVERS[solver](graph, budget, limit)
        bound = max([results[k].lower_bound for k in BOUND_SOLVERS if k in results
                     and math.isfinite(results[k].lower_bound)], default=math.nan)
        for solver, res in results.items():
            sim = simulate(graph, res.schedule, budget) if res.schedule is not None else None
            cost = sim.cost if sim is not None else math.nan
            gap = (cost - bound) / bound if sim is not None and bound > 0 else math.nan
            rows.append(
                {
                    "graph": name,
                    "n": graph.n,
                    "point": point,
                    "budget_bytes": budget,
                    "budget_of_peak": budget / peak_all,
                    "proven_floor_bytes": graph.memory_floor(),
                    "lowest_found_bytes": lowest,
                    "peak_all_bytes": peak_all,
                    "solver": solver,
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
    "| graph | n | budget point | budget / ckpt-all peak | solver | status | sim cost "
    "| overhead | gap to best bound | wall s | simulator |\n|" + "---|" * 11
)


def _md_row(r: dict) -> str:
    verdict = "-" if r["sim_ok"] is None else ("ok" if r["sim_ok"] else "REJECTED")
    return (
        f"| {r['graph']} | {r['n']} | {r['point']} | {r['budget_of_peak']:.3f} | {r['solver']} "
        f"| {r['status']} | {_fmt(r['sim_cost'], '.0f')} | {_fmt(r['overhead'], '.1%')} "
        f"| {_fmt(r['gap_to_best_bound'], '.2%')} | {r['wall_s']:.1f} | {verdict} |"
    )


def _plot(rows: list[dict], path: pathlib.Path) -> None:
    """Overhead over computing every node once against the budget, one panel per graph."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, axes = plt.subplots(1, len(graphs), figsize=(4.5 * len(graphs), 4), squeeze=False)
    for ax, g in zip(axes[0], graphs):
        for solver in dict.fromkeys(r["solver"] for r in rows):
            pts = sorted((r["budget_of_peak"], r["overhead"]) for r in rows
                         if r["graph"] == g and r["solver"] == solver and r["sim_ok"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=solver)
        ax.set(title=g, xlabel="budget / checkpoint-all peak", ylabel="recompute overhead")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _versions() -> str:
    pkgs = ("ortools", "numpy", "scipy", "networkx")
    return f"python {platform.python_version()}, " + ", ".join(f"{p} {importlib.metadata.version(p)}" for p in pkgs)


def _write(rows: list[dict], out: pathlib.Path, argv: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    finite = [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows]
    command = "PYTHONPATH=solvers nice -n 10 python solvers/bench/checkmate_bench.py " + shlex.join(argv)
    meta = {"command": command, "versions": _versions(), "machine": platform.machine(), "rows": finite}
    (out / "results.json").write_text(json.dumps(meta, indent=1))
    floors = "\n".join(
        f"- {r['graph']}: proven floor {r['proven_floor_bytes'] / 2**30:.2f} GiB, lowest found "
        f"{r['lowest_found_bytes'] / 2**30:.2f} GiB, checkpoint-all peak {r['peak_all_bytes'] / 2**30:.2f} GiB"
        for r in {r["graph"]: r for r in rows}.values()
    )
    (out / "results.md").write_text(
        f"Command: `{command}`\n\nVersions: {meta['versions']}\n\n{floors}\n\n"
        + _HEADER + "\n" + "\n".join(_md_row(r) for r in rows) + "\n"
    )
    _plot(rows, out / "overhead.png")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph-dir", type=pathlib.Path, default=DEFAULT_DIR)
    parser.add_argument("--graphs", nargs="*", default=None, help="substrings of file names (default: all *_train_nx)")
    parser.add_argument("--solvers", nargs="*", default=list(SOLVERS), choices=list(SOLVERS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver call")
    parser.add_argument("--exact", nargs="*", default=[], help="GRAPH:POINT:SECONDS, a longer MILP limit")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("checkmate_bench_out"))
    args = parser.parse_args(argv)
    if not args.graph_dir.is_dir():
        print(f"graph directory {args.graph_dir} is absent; nothing to benchmark")
        return 0
    exact = {(g, p): float(sec) for g, p, sec in (e.split(":") for e in args.exact)}
    paths = [p for p in sorted(args.graph_dir.glob("*_train_nx.json"))]
    if args.graphs:
        paths = [p for s in args.graphs for p in paths if s in p.name]
    print(_HEADER)
    rows: list[dict] = []
    for path in paths:
        rows += _run_graph(path, args.solvers, args.time_limit, exact)
        _write(rows, args.out, argv)  # after each graph, so a long run leaves partial results
    print(f"wrote {args.out}/results.md, results.json and overhead.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
