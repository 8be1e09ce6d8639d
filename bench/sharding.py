"""Sharded plans on the TPU compiler: per-device budgets met at three budgets.

A GPT-2-style training step (4 layers, d 512, 8 heads, seq 512, batch 16, vocab 8192,
bf16) sharded over 8 devices in two ways: ``tp`` (a 2x4 ('data', 'model') mesh, batch
over 'data', Megatron-style attention and MLP weights over 'model', the rest
replicated) and ``fsdp`` (every parameter split along its first axis over all 8
devices, the batch over all 8). For each, the step without checkpointing is compiled
for TPU v5e:2x4 ahead of time (its per-device peak), then planned with the closed loop
(``autoremat.plan(..., verify="tpu-v5e")``) at fractions of that peak (a budget the
compiler cannot meet is reported and retried, see ``--retries``); each verified plan's
gradients are then checked against the step without remat on 8 forced CPU devices, with
real random sharded arrays (bf16, the planned configuration; compared with float32
gradients, since bf16 rounding alone exceeds an elementwise rtol of 1e-2).
Writes ``sharding.md`` and ``sharding.json`` to ``--out``.

    AUTOREMAT_MEASURE_CACHE=/work/main/.measure-cache nice -n 10 python bench/sharding.py

Options: ``--setup tp --setup fsdp`` (default both), ``--fractions 0.85,0.75,0.65,0.5``,
``--deadline-min 35`` (no new plan is started after it; the table is then partial),
``--retries 2`` (budgets tried after one the compiler cannot meet: just above the floor
the closed loop reports, or halfway towards the lowest verified peak when that floor is
above it), ``--no-grad-check``.
"""

from __future__ import annotations

import os

# 8 CPU devices for the gradient check: only takes effect before JAX starts.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [
    os.environ.get("XLA_FLAGS"), "--xla_force_host_platform_device_count=8"]))

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import autoremat
from autoremat import _measure
from autoremat._benchmark import versions
from autoremat.zoo import gpt2

CONFIG = gpt2.GPT2Config(n_layer=4, d_model=512, n_head=8, seq_len=512, vocab=8192, batch=16)
TARGET = "tpu-v5e"
MiB = 2**20

# Megatron-style tensor parallelism: column-split in, row-split out projections.
_TP = {"w_qkv": P(None, "model"), "b_qkv": P("model"), "w_fc": P(None, "model"),
       "b_fc": P("model"), "w_out": P("model", None), "w_proj": P("model", None)}
_ALL = ("data", "model")


def specs(style: str) -> tuple[Any, Any]:
    """Parameter and batch partition specs of ``style`` (``tp`` or ``fsdp``)."""
    params = gpt2.param_shapes(CONFIG)
    if style == "tp":
        p = jax.tree.map_with_path(lambda path, _: _TP.get(str(path[-1].key), P()), params)
        return p, jax.tree.map(lambda _: P("data"), gpt2.batch_shapes(CONFIG))
    return (jax.tree.map(lambda _: P(_ALL), params),
            jax.tree.map(lambda _: P(_ALL), gpt2.batch_shapes(CONFIG)))


def sharded_shapes(style: str, mesh: jax.sharding.Mesh) -> tuple[Any, Any]:
    """``(params, batch)`` as ``jax.ShapeDtypeStruct`` leaves sharded over ``mesh``."""
    sds = lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, p))
    pspec, bspec = specs(style)
    return (jax.tree.map(sds, gpt2.param_shapes(CONFIG), pspec),
            jax.tree.map(sds, gpt2.batch_shapes(CONFIG), bspec))


class CompileLog:
    """Counts the closed loop's compiles (``_measure.measure_step`` calls) and their peaks."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._inner = _measure.measure_step

    def __call__(self, fn: Any, *args: Any, **kwargs: Any) -> autoremat.Measurement:
        start = time.perf_counter()
        m = self._inner(fn, *args, **kwargs)
        self.calls.append({"peak_bytes": m.peak_bytes, "seconds": time.perf_counter() - start,
                           "compile_seconds": m.compile_seconds})
        print(f"    compile {len(self.calls)}: peak {m.peak_bytes / MiB:.1f} MiB "
              f"({self.calls[-1]['seconds']:.0f} s)", flush=True)
        return m


def plan_at(loss: Any, args: tuple, budget: int, time_limit_s: float, log: CompileLog
            ) -> tuple[dict, autoremat.Plan | None]:
    """The verified plan at ``budget`` bytes per device and its row."""
    log.calls.clear()
    start = time.perf_counter()
    row: dict[str, Any] = {"budget_bytes": budget}
    try:
        p = autoremat.plan(loss, *args, budget=budget, verify=TARGET, time_limit_s=time_limit_s)
    except autoremat.BudgetNotVerifiedError as e:  # an InfeasibleBudgetError: first
        row.update(status="not verified", floor_bytes=e.floor_bytes, error=str(e))
        p = None
    except autoremat.InfeasibleBudgetError as e:
        row.update(status="infeasible", floor_bytes=e.floor_bytes, error=str(e))
        p = None
    row.update(seconds=time.perf_counter() - start, compiles=list(log.calls))
    if p is not None:
        row.update(status="verified", plan_budget_bytes=p.budget_bytes,
                   predicted_peak_bytes=p.peak_bytes, verified_peak_bytes=p.verified_peak_bytes,
                   fits=p.verified_peak_bytes <= budget, overhead=p.overhead,
                   solver_status=p.status, gap=p.gap, saved_bytes=p.saved_bytes,
                   regions=len(p.placement.cuts) + 1)
    return row, p


def next_budget(row: dict, baseline: int, verified: list[autoremat.Plan]
                ) -> tuple[int, str] | None:
    """The budget to try after ``row``'s budget was infeasible on the compiler: just above
    the floor it reports (the compiler's peak for the plan the model puts lowest), or, when
    a plan verified already peaks lower than that floor (the model's lowest plan is not
    the compiler's), halfway between the failed budget and that plan's peak."""
    if row["status"] != "infeasible":
        return None
    lowest = min((p.verified_peak_bytes for p in verified), default=baseline)
    if row["floor_bytes"] < lowest:
        return -(-row["floor_bytes"] // MiB) * MiB + MiB, "just above the reported floor"
    why = (f"reported floor {row['floor_bytes'] / MiB:.1f} MiB is above a verified plan's "
           f"{lowest / MiB:.1f} MiB: halfway between")
    return (row["budget_bytes"] + lowest) // 2, why


def leaf_errors(reference: Any, actual: Any) -> list[float]:
    """Per leaf: the largest difference from ``reference`` over the reference's largest
    entry."""
    out = []
    for g0, g1 in zip(jax.tree.leaves(reference), jax.tree.leaves(actual), strict=True):
        g0, g1 = np.asarray(g0, np.float32), np.asarray(g1, np.float32)
        out.append(float(np.max(np.abs(g0 - g1))) / max(1e-30, float(np.max(np.abs(g0)))))
    return out


def allclose(reference: Any, actual: Any) -> bool:
    """Every leaf ``allclose`` with rtol 1e-2 (elementwise, no atol)."""
    return all(bool(np.allclose(np.asarray(g1, np.float32), np.asarray(g0, np.float32),
                                rtol=1e-2, atol=0))
               for g0, g1 in zip(jax.tree.leaves(reference), jax.tree.leaves(actual),
                                 strict=True))


def grad_check(style: str, mesh: jax.sharding.Mesh, loss: Any, plans: list[autoremat.Plan]
               ) -> dict:
    """Gradients of each plan against the step without remat, on real sharded arrays.

    bf16 rounding alone moves gradients by about 1e-2 of a leaf's largest entry (the
    recomputed step fuses and rounds differently), so each plan's bf16 gradients and the
    unplanned bf16 step's are both compared with float32 gradients (the same bf16
    parameters cast to float32, without remat): a plan passes when its largest error
    against float32 is within twice the unplanned bf16 step's."""
    k1, k2 = jax.random.split(jax.random.key(0))
    pspec, bspec = specs(style)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    params = jax.tree.map(put, gpt2.init_params(CONFIG, k1), pspec)
    batch = jax.tree.map(put, gpt2.init_batch(CONFIG, k2), bspec)
    start = time.perf_counter()
    step = jax.jit(jax.grad(loss))
    expected = jax.block_until_ready(step(params, batch))
    exact = jax.block_until_ready(step(jax.tree.map(lambda x: x.astype(jnp.float32), params),
                                       batch))
    noise = leaf_errors(exact, expected)
    out = {"bf16_vs_f32_max": max(noise), "reference_seconds": time.perf_counter() - start,
           "plans": []}
    print(f"  {style}: unplanned bf16 vs float32 max error {max(noise):.2e} "
          f"({out['reference_seconds']:.0f} s)", flush=True)
    for p in plans:
        start = time.perf_counter()
        grads = jax.block_until_ready(jax.jit(jax.grad(p.apply(loss)))(params, batch))
        vs_f32, vs_bf16 = leaf_errors(exact, grads), leaf_errors(expected, grads)
        finite = all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
        row = {"budget_bytes": p.budget_bytes, "vs_f32_max": max(vs_f32),
               "vs_bf16_max": max(vs_bf16),
               "worst_leaf_ratio": max(a / max(b, 1e-30)
                                       for a, b in zip(vs_f32, noise, strict=True)),
               "allclose_rtol_1e-2_vs_bf16": allclose(expected, grads), "finite": finite,
               "ok": finite and max(vs_f32) <= 2 * max(noise),
               "seconds": time.perf_counter() - start}
        out["plans"].append(row)
        print(f"  {style} plan at {p.budget_bytes / MiB:.1f} MiB: vs float32 {max(vs_f32):.2e}"
              f" (unplanned bf16 {max(noise):.2e}), vs unplanned bf16 {max(vs_bf16):.2e}, "
              f"ok {row['ok']} ({row['seconds']:.0f} s)", flush=True)
    return out


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


def _compile_s(row: dict) -> str:
    return f"{sum(c['compile_seconds'] for c in row['compiles']):.0f}"


def write(results: dict, out: pathlib.Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sharding.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Sharded plans on the TPU v5e compiler (per device)\n",
        f"Made with `{command}`; versions {json.dumps(results['versions'])}.\n",
        (f"Model: {gpt2.describe(CONFIG)}. Mesh 2x4 ('data', 'model'), compiled ahead of "
         f"time for {results['topology']}. All figures are per device (MiB). `tp`: batch over "
         "'data', w_qkv/b_qkv/w_fc/b_fc column-split and w_out/w_proj row-split over 'model', "
         "the rest replicated. `fsdp`: every parameter's first axis and the batch over all 8 "
         "devices. Plans: `autoremat.plan(loss, params, batch, budget=B, verify=\"tpu-v5e\", "
         "time_limit_s=30)`; 'compiles' counts the closed loop's compiles (disk-cached "
         "compiles included); 'seconds': this run's wall time for the plan (solver and closed "
         "loop; a compile found in the disk cache takes about a second); 'compile s': the seconds "
         "those compiles took when first made (lowering and compiling, as recorded in "
         "the cache), on a shared 2-core machine with other benchmarks running.\n"),
    ]
    if results.get("partial"):
        lines.append(f"**Partial:** {results['partial']}\n")
    lines += [("| setup | budget | fraction | predicted | compiler | fits | overhead | "
               "compiles | seconds | compile s | grads |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for style, r in results["setups"].items():
        base = r.get("baseline")
        if base:
            lines.append(f"| {style} no checkpoint | - | 1.00 | "
                         f"{_mib(base['predicted_peak_bytes'])}"
                         f" | {_mib(base['peak_bytes'])} | - | 0 | 1 | "
                         f"{base['seconds']:.0f} | {base['compile_seconds']:.0f} | reference |")
        checks = {c["budget_bytes"]: c for c in r.get("grad_check", {}).get("plans", [])}
        for row in r.get("plans", []):
            if row["status"] != "verified":
                detail = (f"infeasible, reported floor {_mib(row['floor_bytes'])}"
                          if row["status"] == "infeasible" else row["status"])
                lines.append(f"| {style} | {_mib(row['budget_bytes'])} | "
                             f"{row['fraction']:.2f} | - | - | no ({detail}) | - | "
                             f"{len(row['compiles'])} | {row['seconds']:.0f} | "
                             f"{_compile_s(row)} | - |")
                continue
            c = checks.get(row["plan_budget_bytes"])
            grads = ("not run" if c is None else
                     f"{'ok' if c['ok'] else 'MISMATCH'} ({c['vs_f32_max']:.1e} vs "
                     f"{r['grad_check']['bf16_vs_f32_max']:.1e}; {c['vs_bf16_max']:.1e})")
            lines.append(f"| {style} | {_mib(row['budget_bytes'])} | {row['fraction']:.2f} | "
                         f"{_mib(row['predicted_peak_bytes'])} | "
                         f"{_mib(row['verified_peak_bytes'])} | "
                         f"{'yes' if row['fits'] else 'no'} | {100 * row['overhead']:.2f}% | "
                         f"{len(row['compiles'])} | {row['seconds']:.0f} | "
                         f"{_compile_s(row)} | {grads} |")
    lines.append(
        "\n'grads': `jax.jit(jax.grad(plan.apply(loss)))` on 8 forced CPU devices with real "
        "random sharded bf16 arrays. bf16 rounding alone moves these gradients by about 1e-2 "
        "of a leaf's largest entry (recomputing fuses and rounds differently), so elementwise "
        "`allclose(rtol=1e-2)` fails for the unplanned step's own rounding; instead the plan's "
        "gradients and the unplanned bf16 step's (`jax.jit(jax.grad(loss))`) are both compared "
        "with float32 gradients (the same parameters cast to float32, no remat). In brackets: "
        "the plan's largest error against float32 vs the unplanned bf16 step's (over all "
        "leaves, each relative to the leaf's largest entry), then the plan against the "
        "unplanned bf16 step directly. ok: the plan's error is at most twice the unplanned "
        "step's and all gradients are finite.")
    if results.get("notes"):
        lines += ["", *results["notes"]]
    (out / "sharding.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="append", choices=["tp", "fsdp"])
    parser.add_argument("--fractions", default="0.85,0.75,0.65,0.5")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--deadline-min", type=float, default=35.0)
    parser.add_argument("--retries", type=int, default=2,
                        help="budgets tried after one infeasible on the compiler")
    parser.add_argument("--no-grad-check", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    a = parser.parse_args()
    command = ("AUTOREMAT_MEASURE_CACHE=" + os.environ.get(_measure.CACHE_DIR_ENV, "")
               + " nice -n 10 python bench/sharding.py " + " ".join(sys.argv[1:])).strip()
    setups = a.setup or ["tp", "fsdp"]
    fractions = [float(f) for f in a.fractions.split(",")]
    deadline = time.perf_counter() + 60 * a.deadline_min
    assert jax.device_count() == 8, jax.devices()
    mesh = jax.make_mesh((2, 4), _ALL, axis_types=(AxisType.Auto, AxisType.Auto))
    loss = gpt2.make_loss(CONFIG)
    log = CompileLog()
    _measure.measure_step = log  # the closed loop calls it through the module
    results: dict[str, Any] = {"versions": versions(), "config": gpt2.describe(CONFIG),
                               "topology": _measure.sharded_topology(TARGET, 8),
                               "command": command, "setups": {}, "notes": []}
    plans: dict[str, list[autoremat.Plan]] = {}
    for style in setups:
        r = results["setups"][style] = {"plans": []}
        args = sharded_shapes(style, mesh)
        start = time.perf_counter()
        base = log._inner(loss, *args, target=TARGET)
        model = autoremat.plan(loss, *args, budget=1.0, time_limit_s=a.time_limit)
        r["baseline"] = {"peak_bytes": base.peak_bytes, "temp_bytes": base.temp_bytes,
                         "argument_bytes": base.argument_bytes, "output_bytes": base.output_bytes,
                         "predicted_peak_bytes": model.no_remat_peak_bytes,
                         "compile_seconds": base.compile_seconds,
                         "seconds": time.perf_counter() - start}
        print(f"{style}: no checkpoint {base.peak_bytes / MiB:.1f} MiB on the compiler "
              f"({base.peak_bytes / 1e6:.1f} MB), model {model.no_remat_peak_bytes / MiB:.1f} "
              f"MiB", flush=True)
        write(results, a.out, command)
        plans[style] = []
        for fraction in fractions:
            if time.perf_counter() > deadline:
                results["partial"] = (f"stopped at the {a.deadline_min:.0f}-minute deadline "
                                      f"before {style} at {fraction:.2f}")
                break
            budget = int(fraction * base.peak_bytes)
            print(f"  {style} budget {budget / MiB:.1f} MiB ({fraction:.2f})", flush=True)
            row, p = plan_at(loss, args, budget, a.time_limit, log)
            row["fraction"] = fraction
            r["plans"].append(row)
            for _ in range(a.retries):
                if p is not None:
                    break
                print(f"  -> {row['status']}: {row['error']}", flush=True)
                failed = row
                retry = next_budget(failed, base.peak_bytes, plans[style])
                if retry is None:
                    break
                budget, why = retry
                print(f"  {style} budget {budget / MiB:.1f} MiB ({why})", flush=True)
                row, p = plan_at(loss, args, budget, a.time_limit, log)
                row.update(fraction=budget / base.peak_bytes,
                           retry_of=failed["budget_bytes"], retry_reason=why)
                r["plans"].append(row)
                results["notes"].append(
                    f"{style}: {failed['budget_bytes'] / MiB:.1f} MiB "
                    f"({failed['fraction']:.2f} of the baseline) was infeasible on the compiler "
                    f"(closed loop's reported floor {failed['floor_bytes'] / MiB:.1f} MiB); "
                    f"retried at {budget / MiB:.1f} MiB: {why}.")
            if p is None:
                print(f"  -> {row['status']}: {row.get('error')}", flush=True)
            if p is not None:
                plans[style].append(p)
                print(f"  -> predicted {p.peak_bytes / MiB:.1f} MiB, compiler "
                      f"{p.verified_peak_bytes / MiB:.1f} MiB, overhead {100 * p.overhead:.2f}%, "
                      f"{len(row['compiles'])} compiles, {row['seconds']:.0f} s", flush=True)
            write(results, a.out, command)
        if results.get("partial"):
            break
    if not a.no_grad_check:
        for style in setups:
            if plans.get(style):
                results["setups"][style]["grad_check"] = grad_check(style, mesh, loss,
                                                                    plans[style])
                write(results, a.out, command)
    write(results, a.out, command)


if __name__ == "__main__":
    main()
