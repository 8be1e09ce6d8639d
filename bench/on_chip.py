"""The corpus on a real TPU: plans verified ahead of time on the TPU compiler, then loaded,
compiled with JAX's default options and run on the chip, beside no remat and the hand
baseline (every block in its library's own remat with ``nothing_saveable``).

Two stages, so that the chip's time goes to running rather than planning:

    python bench/on_chip.py plan --out DIR [--model NAME ...]   # any machine, with libtpu
    python bench/on_chip.py run --plans DIR --out DIR           # on a TPU host

``plan`` writes, per full-size corpus model, two policy files (:meth:`autoremat.Plan.save`):
``NAME.floor.json`` (``budget="floor"``) and ``NAME.at-hand.json`` (the budget the
compiler gives the hand baseline), both with ``verify`` on the target (a file already
there is loaded, not planned again), and ``plans.json`` with the ahead-of-time peaks,
rewritten after each model. ``run`` loads each file (:func:`autoremat.load_plan`),
compiles every variant for the host's first TPU with default compiler options (what a user
runs), runs each, writes ``on-chip.json`` and prints the table: the compiled peak and the
median step time. With ``--auto MODEL``, ``run`` also plans that model on the host with
``verify`` left at its default (the host's own TPU) at the budget the chip's compiler
gives the hand baseline, and compiles the plan as the user's ``jax.jit`` does.

The allocator's ``peak_bytes_in_use`` is not reported: it never falls in a process, so it
cannot tell variants run one after another apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

import autoremat
from autoremat import _measure
from autoremat._benchmark import versions
from autoremat._errors import BudgetNotVerifiedError, InfeasibleBudgetError
from bench import corpus

MIB = 2**20
HAND = jax.checkpoint_policies.nothing_saveable
#: The plans ``plan`` makes, by file suffix.
PLANS = ("floor", "at-hand")


def full_models() -> list[str]:
    """The full-size corpus models."""
    return [n for n in corpus.CORPUS if not n.endswith("-tiny")]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- plan: ahead of time, any machine ---------------------------------------------------

def plan_model(name: str, target: str, out: pathlib.Path) -> dict:
    """Saves ``name``'s floor and at-hand plans under ``out``; their ahead-of-time peaks."""
    model = corpus.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    loss, argnums = model.make_loss(), _measure.float_argnums(args)
    peak = lambda fn: _measure.measure_step(fn, *args, target=target, argnums=argnums).peak_bytes
    row: dict[str, Any] = {"model": name, "none": peak(loss), "hand": peak(model.make_loss(HAND))}
    for key, budget in zip(PLANS, ("floor", row["hand"]), strict=True):
        path, start = out / f"{name}.{key}.json", time.perf_counter()
        if path.exists():  # planned by an earlier run that stopped before writing plans.json
            p, seconds = autoremat.load_plan(path, loss, *args), None
        else:
            try:
                p = autoremat.plan(loss, *args, budget=budget, verify=target)
            except (InfeasibleBudgetError, BudgetNotVerifiedError) as e:
                row[key] = {"error": type(e).__name__}
                continue
            p.save(path)
            seconds = time.perf_counter() - start
        row[key] = {"budget": p.budget_bytes, "verified": p.verified_peak_bytes,
                    "predicted": p.peak_bytes, "aot": peak(p.apply(loss)),
                    "regions": len(p.graph.regions), "compiles": p.verify_compiles,
                    "seconds": seconds}
    log(json.dumps(row))
    return row


def plan_main(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.model or full_models():
        rows.append(plan_model(name, args.target, args.out))
        (args.out / "plans.json").write_text(json.dumps(
            {"target": args.target, "versions": versions(), "rows": rows}, indent=1) + "\n")
    print(plans_table(rows))


def plans_table(rows: list[dict]) -> str:
    """Per model: no remat and the hand baseline, then each plan's budget, verified peak
    (the floor's against the hand baseline), compiles and regions."""
    lines = ["| model | no remat MiB | hand MiB | plan | budget MiB | verified MiB | vs hand | "
             "compiles | regions |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for key in PLANS:
            p = r[key]
            head = f"| {r['model']} | {r['none'] / MIB:.1f} | {r['hand'] / MIB:.1f} | {key} |"
            if "error" in p:
                lines.append(f"{head} {p['error']} | | | | |")
                continue
            budget = "floor" if key == "floor" else f"{p['budget'] / MIB:.1f}"
            lines.append(f"{head} {budget} | {p['verified'] / MIB:.1f} | "
                         f"{p['verified'] / r['hand'] - 1:+.1%} | {p.get('compiles', '-')} | "
                         f"{p['regions']} |")
    return "\n".join(lines)


# --- run: on the chip -------------------------------------------------------------------

def variants(name: str, plans: pathlib.Path, params: Any, batch: Any) -> dict[str, Callable]:
    """The losses to run for ``name``: no remat, hand, and each saved plan found."""
    model = corpus.get(name)
    loss = model.make_loss()
    found = {"none": loss, "hand": model.make_loss(HAND)}
    for key in PLANS:
        path = plans / f"{name}.{key}.json"
        if path.exists():
            found[key] = autoremat.load_plan(path, loss, params, batch).apply(loss)
    return found


def compiled_step(fn: Callable, params: Any, batch: Any) -> tuple[Any, int]:
    """``jax.grad(fn)`` compiled for the default device with default options, and the
    compiler's peak bytes."""
    argnums = _measure.float_argnums((params, batch))
    compiled = jax.jit(jax.grad(fn, argnums)).lower(params, batch).compile()
    memory = compiled.memory_analysis()
    assert memory is not None  # the TPU compiler reports it
    return compiled, int(memory.peak_memory_in_bytes)


def free_all() -> None:
    """Deletes every live array, so that the next model starts from an empty chip."""
    gc.collect()
    for a in jax.live_arrays():
        a.delete()


def time_step(compiled: Any, params: Any, batch: Any, steps: int) -> list[float]:
    """Seconds per step over ``steps`` runs after two warm-up runs."""
    for _ in range(2):
        jax.block_until_ready(compiled(params, batch))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, batch))
        times.append(time.perf_counter() - start)
    return times


def compile_all(names: list[str], plans: pathlib.Path, aot_host: bool) -> tuple[list[dict], dict]:
    """Every variant compiled for the chip with default options (and with ``aot_host``,
    ahead of time for ``tpu-v5e`` on this host as ``verify="tpu-v5e"`` compiles it): a
    row of peaks per variant, and the executables by (model, variant)."""
    rows, executables = [], {}
    for name in names:
        params, batch = corpus.get(name).init(jax.random.key(0))
        argnums = _measure.float_argnums((params, batch))
        for variant, fn in variants(name, plans, params, batch).items():
            executables[name, variant], peak = compiled_step(fn, params, batch)
            rows.append({"model": name, "variant": variant, "compiled": peak})
            if aot_host:
                rows[-1]["aot_host"] = _measure.measure_step(
                    fn, params, batch, target="tpu-v5e", argnums=argnums).peak_bytes
            log(json.dumps(rows[-1]))
        del params, batch
        free_all()
    return rows, executables


def run_all(rows: list[dict], executables: dict, steps: int) -> None:
    """Runs every row's step; adds its step times to the row."""
    for row in rows:
        params, batch = corpus.get(row["model"]).init(jax.random.key(0))
        times = time_step(executables[row["model"], row["variant"]], params, batch, steps)
        row.update(step_ms=1e3 * statistics.median(times), step_ms_all=[1e3 * t for t in times])
        log(json.dumps({k: v for k, v in row.items() if k != "step_ms_all"}))
        del params, batch
        free_all()


def plan_on_host(name: str) -> list[dict]:
    """Plans ``name`` on this TPU host with ``verify`` at its default, for the floor and for
    the budget this host's compiler gives the hand baseline, and compiles each plan as a
    user's ``jax.jit`` does."""
    model = corpus.get(name)
    params, batch = model.init(jax.random.key(0))
    loss = model.make_loss()
    _, hand = compiled_step(model.make_loss(HAND), params, batch)
    rows = []
    for budget in ("floor", hand):
        start = time.perf_counter()
        row: dict[str, Any] = {"model": name, "local_target": autoremat.local_target(),
                               "hand": hand, "budget": budget}
        try:
            p = autoremat.plan(loss, params, batch, budget=budget)
        except (InfeasibleBudgetError, BudgetNotVerifiedError) as e:
            row["error"] = f"{type(e).__name__}: {e}"
        else:
            _, compiled = compiled_step(p.apply(loss), params, batch)
            row.update(verify_target=p.verify_target, verified=p.verified_peak_bytes,
                       compiles=p.verify_compiles, compiled=compiled,
                       regions=len(p.graph.regions))
        row["seconds"] = time.perf_counter() - start
        log(json.dumps(row))
        rows.append(row)
    del params, batch
    free_all()
    return rows


def run_main(args: argparse.Namespace) -> None:
    if jax.default_backend() != "tpu":
        sys.exit(f"run needs a TPU host; JAX's backend here is {jax.default_backend()!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    saved = json.loads((args.plans / "plans.json").read_text())
    names = args.model or [r["model"] for r in saved["rows"]]
    rows, executables = compile_all(names, args.plans, args.aot_host)
    run_all(rows, executables, args.steps)
    auto = [row for name in args.auto or () for row in plan_on_host(name)]
    result = {"device": jax.devices()[0].device_kind, "versions": versions(),
              "steps": args.steps, "rows": rows, "auto": auto, "plans": saved}
    (args.out / "on-chip.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table([result]))


# --- the table --------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    """Per model and variant: the plan's budget, its peak verified ahead of time, its peak
    compiled on the chip with default options, and the median step time; then the plans
    made on the host with ``verify`` at its default."""
    lines = ["| model | variant | budget MiB | ahead of time MiB | compiled on chip MiB | "
             "chip over budget | step ms | vs hand |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    auto = ["| model | hand on chip MiB | budget MiB | verify | compiles | verified MiB | "
            "compiled as jit MiB | at or under budget (floor: hand) | regions | seconds |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for result in results:
        aot = {r["model"]: r for r in result["plans"]["rows"]}
        hand = {r["model"]: r["step_ms"] for r in result["rows"] if r["variant"] == "hand"}
        for r in result["rows"]:
            saved = aot[r["model"]][r["variant"]]
            plan = saved if isinstance(saved, dict) else {"aot": saved}
            over = (f"{r['compiled'] / plan['budget'] - 1:+.1%}" if "budget" in plan else "-")
            budget = f"{plan['budget'] / MIB:.1f}" if "budget" in plan else "-"
            lines.append(
                f"| {r['model']} | {r['variant']} | {budget} | {plan['aot'] / MIB:.1f} | "
                f"{r['compiled'] / MIB:.1f} | {over} | {r['step_ms']:.2f} | "
                f"{r['step_ms'] / hand[r['model']] - 1:+.1%} |")
        for r in result["auto"]:
            budget = "floor" if r["budget"] == "floor" else f"{r['budget'] / MIB:.1f}"
            if "error" in r:
                auto.append(f"| {r['model']} | {r['hand'] / MIB:.1f} | {budget} | "
                            f"{r['error']} |")
                continue
            fits = r["compiled"] <= (r["hand"] if r["budget"] == "floor" else r["budget"])
            auto.append(
                f"| {r['model']} | {r['hand'] / MIB:.1f} | {budget} | {r['verify_target']} | "
                f"{r['compiles']} | {r['verified'] / MIB:.1f} | {r['compiled'] / MIB:.1f} | "
                f"{'yes' if fits else 'no'} | {r['regions']} | {r['seconds']:.0f} |")
    return "\n".join(lines + ([""] + auto if len(auto) > 2 else []))


def table_main(args: argparse.Namespace) -> None:
    results = [json.loads(p.read_text()) for p in args.results]
    if all("plans" in r for r in results):  # on-chip.json
        print(table(results))
    else:
        print(plans_table([row for r in results for row in r["rows"]]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    p = sub.add_parser("plan", help="plan and save, ahead of time")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--target", default="tpu-v5e")
    p.add_argument("--model", action="append", help="repeatable; default: every full model")
    p.set_defaults(main=plan_main)
    r = sub.add_parser("run", help="load, compile and run on this host's TPU")
    r.add_argument("--plans", type=pathlib.Path, required=True)
    r.add_argument("--out", type=pathlib.Path, required=True)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--model", action="append", help="repeatable; default: every planned one")
    r.add_argument("--auto", action="append", help="also plan this model on the host")
    r.add_argument("--aot-host", action="store_true",
                   help="also compile each variant ahead of time on the host")
    r.set_defaults(main=run_main)
    t = sub.add_parser("table", help="the Markdown table of run or plan results")
    t.add_argument("results", type=pathlib.Path, nargs="+",
                   help="on-chip.json files, or plans.json files")
    t.set_defaults(main=table_main)
    args = parser.parse_args(argv)
    args.main(args)


if __name__ == "__main__":
    main()
