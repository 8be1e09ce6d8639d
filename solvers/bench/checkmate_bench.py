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
``--exact GRAPH:POINT:SECONDS`` gives the exact solvers (``checkmate_milp`` and
``checkmate_milp_warm``) a longer limit at one budget point (e.g. ``ResNet50:p90:600``);
``--only GRAPH:POINT`` restricts a graph to the listed budget points. The "own gap" column is a
solver's cost against its own proven lower bound: for an exact solver, 0 with status optimal
(its wall time is then the time to the proof), else the gap left at the time limit.
``--zoo MODEL ...`` runs autoremat's zoo models instead: their training graphs are exported
with ``autoremat._export.training_graph`` (the only use of JAX here) into ``OUT/graphs``.

Usage:
  PYTHONPATH=solvers nice -n 10 python solvers/bench/checkmate_bench.py \
      --graphs VGG16 VGG19 MobileNet ResNet50 --time-limit 30 --exact ResNet50:p90:300 \
      --out solvers/bench/results
  PYTHONPATH=solvers nice -n 5 python solvers/bench/checkmate_bench.py \
      --graphs VGG16 VGG19 MobileNet ResNet50 --solvers checkmate_milp_warm jax_policy \
      --time-limit 120 --only ResNet50:p90 ResNet50:s50 --exact ResNet50:p90:600 ResNet50:s50:600 \
      --out solvers/bench/results/exact
  PYTHONPATH=solvers nice -n 15 python solvers/bench/checkmate_bench.py \
      --zoo mlp-tiny resnet-tiny unet-tiny gpt2-small-tiny --time-limit 20 \
      --out solvers/bench/results/zoo
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
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

DEFAULT_DIR = (pathlib.Path(__file__).resolve().parents[3]
               / "shared" / "benchmarks" / "checkmate-graphs")
# Of the way from the lowest found budget to the checkpoint-all peak.
SPAN_POINTS = (0.25, 0.5, 0.75)
PEAK_POINTS = (0.8, 0.9)  # of the checkpoint-all peak
# Lower bounds valid for any schedule in Checkmate's model (CP-SAT's holds only for its own).
BOUND_SOLVERS = ("checkmate_milp", "checkmate_milp_warm", "checkmate_lp_rounding")
EXACT_SOLVERS = ("checkmate_milp", "checkmate_milp_warm")


def _budgets(graph: ComputeGraph) -> tuple[int, int, dict[str, float]]:
    """``(checkpoint-all peak, lowest found budget, {point name: budget})``."""
    peaks = [simulate(graph, BASELINES[name](graph, math.inf).schedule, math.inf).peak_ram
             for name in BASELINES]
    keep_all = BASELINES["checkpoint_all"](graph, math.inf).schedule
    peak_all = simulate(graph, keep_all, math.inf).peak_ram
    lowest = min(peaks)
    points = {"lowest": float(lowest)}
    points.update({f"s{round(100 * x)}": lowest + x * (peak_all - lowest) for x in SPAN_POINTS})
    points.update({f"p{round(100 * x)}": x * peak_all for x in PEAK_POINTS
                   if x * peak_all >= lowest})
    return peak_all, lowest, dict(sorted(points.items(), key=lambda kv: kv[1]))


def _export_zoo(names: list[str], directory: pathlib.Path) -> list[pathlib.Path]:
    """Writes the training graphs of zoo models ``names`` as
    ``directory/NAME__zoo_train_nx.json``."""
    from autoremat import zoo
    from autoremat._export import training_graph

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        model = zoo.get(name)
        data = training_graph(model.make_loss(), model.param_shapes(), model.batch_shapes(),
                              name=name)
        paths.append(directory / f"{name}__zoo_train_nx.json")
        paths[-1].write_text(json.dumps(data))
    return paths


def _run_graph(path: pathlib.Path, solvers: list[str], time_limit_s: float,
               exact: dict[tuple[str, str], float], only: set[tuple[str, str]]) -> list[dict]:
    graph = load_graph_json(path)
    name = path.name.split("__")[0]
    peak_all, lowest, points = _budgets(graph)
    rows = []
    for point, budget in points.items():
        if any(g == name for g, _ in only) and (name, point) not in only:
            continue
        results = {}
        for solver in solvers:
            limit = (exact.get((name, point), time_limit_s) if solver in EXACT_SOLVERS
                     else time_limit_s)
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
                    "own_gap": (cost - res.lower_bound) / cost
                    if sim is not None and res.lower_bound > 0 else math.nan,
                    "wall_s": res.wall_s,
                    "sim_ok": None if sim is None else sim.ok,
                    "sim_peak": None if sim is None else sim.peak_ram,
                    "violations": [] if sim is None else list(sim.violations),
                }
            )
            print(_md_row(rows[-1]), flush=True)
    return rows


def _bytes(x: float) -> str:
    """``x`` bytes in GiB, or in MiB below 1 GiB (the zoo's tiny models)."""
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.3f} MiB"


def _fmt(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


_HEADER = (
    "| graph | n | budget point | budget / ckpt-all peak | solver | status | sim cost "
    "| overhead | gap to best bound | own gap | wall s | simulator |\n|" + "---|" * 12
)


def _md_row(r: dict) -> str:
    verdict = "-" if r["sim_ok"] is None else ("ok" if r["sim_ok"] else "REJECTED")
    return (
        f"| {r['graph']} | {r['n']} | {r['point']} | {r['budget_of_peak']:.3f} | {r['solver']} "
        f"| {r['status']} | {_fmt(r['sim_cost'], '.0f')} | {_fmt(r['overhead'], '.1%')} "
        f"| {_fmt(r['gap_to_best_bound'], '.2%')} | {_fmt(r.get('own_gap', math.nan), '.3%')} "
        f"| {r['wall_s']:.1f} | {verdict} |"
    )


def _plot(rows: list[dict], path: pathlib.Path) -> None:
    """Overhead over computing every node once against the budget, one panel per graph."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, axes = plt.subplots(1, len(graphs), figsize=(4.5 * len(graphs), 4), squeeze=False)
    for ax, g in zip(axes[0], graphs, strict=True):
        for solver in dict.fromkeys(r["solver"] for r in rows):
            pts = sorted((r["budget_of_peak"], r["overhead"]) for r in rows
                         if r["graph"] == g and r["solver"] == solver and r["sim_ok"])
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=solver)
        ax.set(title=g, xlabel="budget / checkpoint-all peak", ylabel="recompute overhead")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _versions() -> str:
    pkgs = ("ortools", "highspy", "numpy", "scipy", "networkx")
    return f"python {platform.python_version()}, " + ", ".join(
        f"{p} {importlib.metadata.version(p)}" for p in pkgs)


def _exact_summary(rows: list[dict]) -> str:
    """Per graph and budget: the exact solver's proof time or final gap, and jax_policy
    against the best bound."""
    lines = []
    keys = list(dict.fromkeys((r["graph"], r["point"]) for r in rows))
    for solver in EXACT_SOLVERS:
        for g, p in keys:
            ex = next((r for r in rows
                       if (r["graph"], r["point"], r["solver"]) == (g, p, solver)), None)
            if ex is None:
                continue
            pol = next((r for r in rows
                        if (r["graph"], r["point"], r["solver"]) == (g, p, "jax_policy")), None)
            proof = f"{ex['wall_s']:.1f}" if ex["status"] == "optimal" else "-"
            lines.append(
                f"| {g} | {p} | {ex['budget_of_peak']:.3f} | {solver} | {ex['status']} | {proof} "
                f"| {_fmt(ex['own_gap'], '.3%')} | {_fmt(ex['sim_cost'], '.0f')} "
                f"| {_fmt(ex['lower_bound'], '.0f')} "
                f"| {ex['wall_s']:.1f} | {_fmt(pol['sim_cost'] if pol else math.nan, '.0f')} "
                f"| {_fmt(pol['gap_to_best_bound'] if pol else math.nan, '.3%')} |"
            )
    if not lines:
        return ""
    return (
        "Exact method per graph and budget: time to proven optimality (relative gap 1e-4, or an "
        "absolute gap < 1 with integral costs), else the gap left at the limit; and `jax_policy`'s "
        "cost against the best proven bound.\n\n"
        "| graph | point | budget / ckpt-all peak | exact solver | status | proof s | final gap "
        "| cost | lower bound | wall s | jax_policy cost | jax_policy gap to bound |\n|"
        + "---|" * 12 + "\n"
        + "\n".join(lines) + "\n\nAll rows:\n\n"
    )


def _write(rows: list[dict], out: pathlib.Path, argv: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    finite = [{k: None if isinstance(v, float) and not math.isfinite(v) else v
               for k, v in r.items()} for r in rows]
    command = (f"PYTHONPATH=solvers nice -n {os.nice(0)} python solvers/bench/checkmate_bench.py "
               + shlex.join(argv))
    meta = {"command": command, "versions": _versions(), "machine": platform.machine(),
            "rows": finite}
    (out / "results.json").write_text(json.dumps(meta, indent=1))
    floors = "\n".join(
        f"- {r['graph']} ({r['n']} nodes): proven floor {_bytes(r['proven_floor_bytes'])}, "
        "lowest found "
        f"{_bytes(r['lowest_found_bytes'])}, checkpoint-all peak {_bytes(r['peak_all_bytes'])}"
        for r in {r["graph"]: r for r in rows}.values()
    )
    (out / "results.md").write_text(
        f"Command: `{command}`\n\nVersions: {meta['versions']}\n\n{floors}\n\n"
        + _exact_summary(rows) + _HEADER + "\n" + "\n".join(_md_row(r) for r in rows) + "\n"
    )
    _plot(rows, out / "overhead.png")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graph-dir", type=pathlib.Path, default=DEFAULT_DIR)
    parser.add_argument("--graphs", nargs="*", default=None,
                        help="substrings of file names (default: all *_train_nx)")
    parser.add_argument("--solvers", nargs="*", default=list(SOLVERS), choices=list(SOLVERS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solver call")
    parser.add_argument("--exact", nargs="*", default=[],
                        help="GRAPH:POINT:SECONDS, a longer MILP limit")
    parser.add_argument("--only", nargs="*", default=[],
                        help="GRAPH:POINT, run only these points of GRAPH")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("checkmate_bench_out"))
    parser.add_argument("--zoo", nargs="*", default=[],
                        help="zoo models to export and run instead (needs autoremat)")
    args = parser.parse_args(argv)
    if not args.zoo and not args.graph_dir.is_dir():
        print(f"graph directory {args.graph_dir} is absent; nothing to benchmark")
        return 0
    exact = {(g, p): float(sec) for g, p, sec in (e.split(":") for e in args.exact)}
    only = {tuple(e.split(":")) for e in args.only}
    paths = (_export_zoo(args.zoo, args.out / "graphs") if args.zoo
             else sorted(args.graph_dir.glob("*_train_nx.json")))
    if args.graphs:
        paths = [p for s in args.graphs for p in paths if s in p.name]
    print(_HEADER)
    rows: list[dict] = []
    for path in paths:
        rows += _run_graph(path, args.solvers, args.time_limit, exact, only)
        _write(rows, args.out, argv)  # after each graph, so a long run leaves partial results
    print(f"wrote {args.out}/results.md, results.json and overhead.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
