"""The memory model against the TPU compiler, plan by plan, on corpus and zoo models.

    python bench/fidelity.py plans MODEL DIR          # as written, the floor, 3 budgets
    python bench/fidelity.py verify MODEL BUDGET DIR  # one budget planned with verify
    python bench/fidelity.py summary DIR              # the tables of DIR's rows

``plans`` plans the model without ``verify`` (``layout="tiled"``) as written, at
``budget="floor"`` and at three budgets from the floor plan's predicted peak to no
remat's device memory, compiles each for TPU v5e ahead of time and writes
``DIR/plans/MODEL.json``: per plan, the predicted peak, the device memory
(:attr:`autoremat.Measurement.peak_bytes`: arguments + outputs + temp), the compiler's own
``peak_memory_in_bytes`` and temp, and the model's peak without the regions' working sets
(its stages less every forward working set, cotangent and recomputed value: what the
model holds of saved values, arguments and gradients alone). ``verify`` plans one budget
with ``verify="tpu-v5e"`` and writes ``DIR/verify/MODEL-BUDGET.json``: the compiled device
memory, whether it fits, and the compiles it took. Run with
``AUTOREMAT_MEASURE_CACHE`` set, a ``verify`` after ``plans`` finds the first
compile (the same plan) in the cache; it is still counted.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import sys
import time

import autoremat_ilp as ilp
import numpy as np

from autoremat import Plan, _measure, zoo
from autoremat._benchmark import budgets_between
from autoremat._errors import InfeasibleBudgetError
from autoremat._planner._api import plan_with
from autoremat._planner._options import PlanOptions
from autoremat._solve import _written, as_written_masks, fused_as_written, problem_of
from bench import corpus

MIB = 2**20
TARGET = "tpu-v5e"


def model_of(name: str) -> zoo.ZooModel:
    return corpus.CORPUS[name] if name in corpus.CORPUS else zoo.get(name)


def without_working_sets(p: Plan) -> int:
    """The plan's modelled peak with no region's working set, cotangents or recomputed
    values counted (its stages less those terms; of the masks the model judges it by)."""
    g = p.graph
    problem = problem_of(g)
    cot = np.array([r.cotangent_bytes for r in g.regions], np.int64)
    work = np.array([r.work_bytes for r in g.regions], np.int64)
    bare = dict(base=problem.base - cot, forward_base=problem.forward_base - work,
                transient=np.zeros_like(problem.transient))
    if problem.reserved_base is not None:
        assert problem.reserved_forward_base is not None
        bare.update(reserved_base=problem.reserved_base - cot,
                    reserved_forward_base=problem.reserved_forward_base - work)
    if p.no_remat:
        masks = [as_written_masks(g, problem)]
    else:
        ids = g.array("id")
        save, rec = np.isin(ids, list(p.saved)), np.isin(ids, list(p.recomputed))
        masks = [(save, rec)]
        if g.placement.written:
            masks.append(fused_as_written(g, problem, save, rec, _written(g, problem)))
    peak = lambda pr, m: int(max(ilp.stage_bytes(pr, *m)))
    least = min(masks, key=lambda m: peak(problem, m))
    return peak(dataclasses.replace(problem, **bare), least)


def plan_rows(name: str, out: pathlib.Path) -> None:
    model = model_of(name)
    args, loss = (model.param_shapes(), model.batch_shapes()), model.make_loss()
    argnums = _measure.float_argnums(args)
    options = PlanOptions(layout="tiled")
    rows: list[dict] = []
    path = out / "plans" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def add(kind: str, p: Plan, budget: int | None) -> None:
        m = _measure.measure_step(p.apply(loss), *args, target=TARGET, argnums=argnums)
        rows.append(dict(model=name, kind=kind, budget=budget, predicted=p.peak_bytes,
                         device=m.peak_bytes, compiler_peak=m.compiler_peak_bytes,
                         temp=m.temp_bytes, arguments_outputs=m.argument_bytes + m.output_bytes,
                         without_working_sets=without_working_sets(p),
                         regions=len(p.graph.regions), no_remat=p.no_remat))
        path.write_text(json.dumps(rows, indent=1))
        print(name, kind, p.peak_bytes // MIB, m.peak_bytes // MIB, flush=True)

    top = _measure.measure_step(loss, *args, target=TARGET, argnums=argnums).peak_bytes
    add("as written", plan_with(loss, args, {}, 10 * top, options), None)
    floor = plan_with(loss, args, {}, "floor", options)
    add("floor", floor, None)
    for budget in budgets_between(floor.peak_bytes, max(top, floor.peak_bytes), 3):
        add("budget", plan_with(loss, args, {}, budget, options), budget)


def verify_row(name: str, budget: int, out: pathlib.Path) -> None:
    model = model_of(name)
    args, loss = (model.param_shapes(), model.batch_shapes()), model.make_loss()
    start = time.perf_counter()
    try:
        p = plan_with(loss, args, {}, budget, PlanOptions(layout="tiled", verify=TARGET))
        row: dict = dict(model=name, budget=budget, device=p.verified_peak_bytes,
                         compiles=p.verify_compiles, predicted=p.peak_bytes,
                         no_remat=p.no_remat)
    except InfeasibleBudgetError as e:
        row = dict(model=name, budget=budget, infeasible=str(e))
    row["seconds"] = time.perf_counter() - start
    path = out / "verify" / f"{name}-{budget}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=1))
    print(row, flush=True)


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _spread(errors: list[float]) -> str:
    q = np.percentile(errors, [25, 50, 75])
    return (f"median |error| {100 * statistics.median(abs(e) for e in errors):.1f}%; "
            f"quartiles {', '.join(_pct(x) for x in q)}; range {_pct(min(errors))} to "
            f"{_pct(max(errors))}; within 5%: {sum(abs(e) <= 0.05 for e in errors)} of "
            f"{len(errors)}")


def summary(out: pathlib.Path) -> str:
    """The markdown tables of the rows under ``out``."""
    plans = [r for f in sorted((out / "plans").glob("*.json")) for r in json.loads(f.read_text())]
    lines = ["| model | plan | predicted | device memory | compiler peak | without working "
             "sets | arguments + outputs | predicted / device − 1 |", "|---" * 8 + "|"]
    for r in plans:
        kind = r["kind"] if r["budget"] is None else f"budget {r['budget'] / MIB:.0f}"
        lines.append(f"| {r['model']} | {kind} | {r['predicted'] / MIB:.1f} | "
                     f"{r['device'] / MIB:.1f} | {r['compiler_peak'] / MIB:.1f} | "
                     f"{r['without_working_sets'] / MIB:.1f} | "
                     f"{r['arguments_outputs'] / MIB:.1f} | "
                     f"{_pct(r['predicted'] / r['device'] - 1)} |")
    zoo_names = set(zoo.ZOO)
    for label, keep in (("corpus", lambda r: r["model"] not in zoo_names),
                        ("zoo", lambda r: r["model"] in zoo_names)):
        chosen = [r for r in plans if keep(r)]
        if chosen:
            lines.append(f"\n{label}, predicted / device memory − 1: "
                         + _spread([r["predicted"] / r["device"] - 1 for r in chosen]))
            lines.append(f"{label}, predicted / compiler peak − 1: "
                         + _spread([r["predicted"] / r["compiler_peak"] - 1 for r in chosen]))
            # The top budget is no remat's device memory, which the function as written meets.
            written = {r["model"]: r["device"] for r in chosen if r["kind"] == "as written"}
            budgets = [r for r in chosen
                       if r["budget"] is not None and r["budget"] < written[r["model"]]]
            fit = sum(r["device"] <= r["budget"] for r in budgets)
            lines.append(f"{label}, budgets below no remat's device memory planned without "
                         f"verify that fit: {fit} of {len(budgets)}")
    verified = [json.loads(f.read_text()) for f in sorted((out / "verify").glob("*.json"))]
    if verified:
        lines += ["", "| model | budget | with verify: device memory | compiles | fits |",
                  "|---" * 5 + "|"]
        for r in verified:
            if "infeasible" in r:
                lines.append(f"| {r['model']} | {r['budget'] / MIB:.1f} | infeasible: "
                             f"{r['infeasible'].split(';')[1].strip()} | | |")
            else:
                lines.append(f"| {r['model']} | {r['budget'] / MIB:.1f} | "
                             f"{r['device'] / MIB:.1f} | {r['compiles']} | "
                             f"{'yes' if r['device'] <= r['budget'] else 'no'} |")
        counts = [r["compiles"] for r in verified if "compiles" in r]
        lines.append(f"\ncompiles per verified budget: mean {statistics.mean(counts):.2f}, "
                     f"at most {max(counts)}, over {len(counts)} budgets")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "plans":
        plan_rows(rest[0], pathlib.Path(rest[1]))
    elif command == "verify":
        verify_row(rest[0], int(rest[1]), pathlib.Path(rest[2]))
    elif command == "summary":
        print(summary(pathlib.Path(rest[0])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
