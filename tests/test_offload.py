"""Host offload: the three-way model (keep, offload, recompute) on traced graphs, its plans
and what JAX and the TPU compiler do with them (the model alone: tests/ilp/)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import autoremat_ilp as ilp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _measure, _solve, _trace
from autoremat.zoo import gpt2
from tests import models

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='the TPU compiler is not installed: pip install "autoremat[tpu]"')

# Transfers priced as nearly free, so that tiny models offload (at real PCIe rates they
# recompute instead: their values are cheap to recompute).
CHEAP = autoremat.OffloadConfig(host_budget="1MiB", host_bandwidth=1e14, peak_flops=1e12)


def _allclose(a, b) -> bool:
    return all(np.allclose(x, y, rtol=1e-4, atol=1e-6)
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _problem(plan: autoremat.Plan, config: autoremat.OffloadConfig):
    graph = plan.graph
    problem = _solve.problem_of(graph, offload=config)
    ids = graph.array("id")
    masks = [np.isin(ids, list(s)) for s in (plan.saved, plan.recomputed, plan.offloaded)]
    return problem, masks


@pytest.fixture(scope="module")
def scanned():
    loss, args = models.gpt2_tiny(scan_layers=True)
    floor = autoremat.plan(loss, *args, budget=0.3)
    return loss, args, floor.budget_bytes


@pytest.fixture(scope="module")
def scanned_grads(scanned):
    loss, args, _ = scanned
    return jax.jit(jax.grad(loss))(*args)


def test_offload_plan_keeps_gradients_and_fits(scanned, scanned_grads):
    loss, args, budget = scanned
    p = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    assert p.offloaded and not p.offloaded & p.saved
    assert p.peak_bytes <= p.budget_bytes
    assert 0 < p.offloaded_bytes <= CHEAP.host_budget_bytes
    problem, (save, recompute, offload) = _problem(p, CHEAP)
    assert ilp.violations(problem, save, recompute, offload) == []
    assert ilp.evaluate(problem, save, recompute, offload)[1] == p.peak_bytes
    assert ilp.host_bytes(problem, offload) == p.offloaded_bytes
    # Offloading replaces recomputation here: cheaper than the recompute-only plan.
    base = autoremat.plan(loss, *args, budget=budget)
    assert p.modeled_overhead < base.overhead
    assert _allclose(jax.jit(jax.grad(p.apply(loss)))(*args), scanned_grads)


@pytest.mark.parametrize("remat3", [False, True], ids=["remat2", "remat3"])
def test_offload_policy_keeps_gradients_in_both_remat_modes(remat3):
    # jax 0.10.2's remat3 ignores offload in policies (the values are recomputed instead):
    # gradients stay right; only remat2 moves the named value to host memory.
    from jax.ad_checkpoint import checkpoint_name

    from autoremat import _program

    def f(w, x):
        h = checkpoint_name(jnp.tanh(x @ w), _program.value_name(0))
        y = checkpoint_name(jnp.sin(h @ w), _program.value_name(1))
        return jnp.sum(y ** 2)

    step = jax.checkpoint(f, policy=_program.policy_for({1}, {0}))
    w, x = jnp.ones((8, 8)) / 8, jnp.linspace(0, 1, 32).reshape(4, 8)
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", remat3)
    try:
        got = jax.jit(jax.grad(step, argnums=(0, 1)))(w, x)
        text = str(jax.make_jaxpr(jax.grad(step))(w, x))
    finally:
        jax.config.update("jax_remat3", old)
    assert _allclose(got, jax.grad(f, argnums=(0, 1))(w, x))
    assert ("<host>" in text) == (not remat3)


def test_offloaded_values_go_to_host_in_the_jaxpr(scanned):
    loss, args, budget = scanned
    p = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    text = str(jax.make_jaxpr(jax.grad(p.apply(loss)))(*args))
    assert "<host>" in text and "device_put" in text
    base = autoremat.plan(loss, *args, budget=budget)
    assert "<host>" not in str(jax.make_jaxpr(jax.grad(base.apply(loss)))(*args))


def test_host_budget_bounds_offloaded_bytes(scanned):
    loss, args, budget = scanned
    roomy = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    small = dataclasses.replace(CHEAP, host_budget=roomy.offloaded_bytes // 2)
    p = autoremat.plan(loss, *args, budget=budget, offload=small)
    assert p.offloaded_bytes <= roomy.offloaded_bytes // 2
    assert p.modeled_overhead >= roomy.modeled_overhead
    assert p.peak_bytes <= p.budget_bytes


def test_offload_plans_are_deterministic(scanned):
    loss, args, budget = scanned
    a = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    b = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    assert a == b and a.offloaded == b.offloaded


def test_without_offload_the_model_is_unchanged(scanned):
    loss, args, budget = scanned
    assert autoremat.plan(loss, *args, budget=budget) == autoremat.plan(
        loss, *args, budget=budget, offload=None)
    # Offload allowed but nothing offloadable: the very same integer program.
    _, _, graph = _trace.trace(*_flat(loss, args))
    problem = _solve.problem_of(graph)
    none = dataclasses.replace(problem, can_offload=np.zeros(problem.num_values, bool),
                               offload_cost=np.zeros(problem.num_values),
                               offload_forward=problem.held, offload_backward=problem.held,
                               host_budget=0.0)
    for budget_arg in (budget, None):
        a, b = ilp.build_model(problem, budget_arg).milp, ilp.build_model(none, budget_arg).milp
        assert (a.A != b.A).nnz == 0 and np.array_equal(a.c, b.c)
        assert np.array_equal(a.row_ub, b.row_ub) and np.array_equal(a.var_ub, b.var_ub)


def test_real_bandwidth_prefers_recompute_on_cheap_values(scanned):
    # At PCIe rates a tiny model's values are far cheaper to recompute than to move.
    loss, args, budget = scanned
    real = autoremat.OffloadConfig(host_budget="1GiB", target="tpu-v5e")
    p = autoremat.plan(loss, *args, budget=budget, offload=real)
    assert not p.offloaded
    # The same cost as without offload (the solver may pick another plan of equal cost).
    base = autoremat.plan(loss, *args, budget=budget)
    assert p.recompute_flops == pytest.approx(base.recompute_flops, rel=1e-3)


def test_unrolled_regions_offload_only_when_asked():
    loss, args = models.gpt2_tiny(scan_layers=False)
    budget = autoremat.plan(loss, *args, budget=0.45).budget_bytes
    assert not autoremat.plan(loss, *args, budget=budget, offload=CHEAP).offloaded
    everywhere = dataclasses.replace(CHEAP, regions="all")
    p = autoremat.plan(loss, *args, budget=budget, offload=everywhere)
    assert p.offloaded and p.peak_bytes <= p.budget_bytes
    assert _allclose(jax.jit(jax.grad(p.apply(loss)))(*args), jax.jit(jax.grad(loss))(*args))


def test_report_shows_offload_and_policy_files_keep_it(scanned, tmp_path):
    loss, args, budget = scanned
    p = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    text = p.report()
    assert "offloaded to host" in text and "\noffload " in text
    p.save(tmp_path / "p.json")
    loaded = autoremat.load_plan(tmp_path / "p.json", loss, *args)
    assert loaded.offload == dataclasses.replace(CHEAP, host_budget=CHEAP.host_budget_bytes)
    assert (loaded.saved, loaded.recomputed, loaded.offloaded) == (p.saved, p.recomputed,
                                                                   p.offloaded)
    assert (loaded.peak_bytes, loaded.offloaded_bytes, loaded.offload_flops) == (
        p.peak_bytes, p.offloaded_bytes, p.offload_flops)
    assert "offload" in autoremat.PolicyFile.read(tmp_path / "p.json").to_json()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="overlap"):
        autoremat.OffloadConfig(host_budget="1GiB", overlap=1.5)
    with pytest.raises(ValueError, match="fraction"):
        autoremat.OffloadConfig(host_budget=0.5)
    with pytest.raises(ValueError, match="no host bandwidth figures"):
        autoremat.OffloadConfig(host_budget="1GiB", target="gpu")
    with pytest.raises(ValueError, match="regions"):
        autoremat.OffloadConfig(host_budget="1GiB", regions="some")
    cfg = autoremat.OffloadConfig(host_budget="1GiB", target="tpu-v5e", overlap=0.5)
    # 2 bytes moved per byte, at 1.5e10 B/s, priced at 197 TFLOP/s, half hidden.
    assert cfg.flops_per_byte == pytest.approx(2 / 1.5e10 * 197e12 * 0.5)


@needs_libtpu
def test_tpu_compiler_puts_offloaded_residuals_in_host_memory():
    c = dataclasses.replace(gpt2.GPT2_TINY, dtype=jnp.bfloat16, scan_layers=True)
    loss, args = gpt2.make_loss(c), (gpt2.param_shapes(c), gpt2.batch_shapes(c))
    budget = autoremat.plan(loss, *args, budget=0.3).budget_bytes
    p = autoremat.plan(loss, *args, budget=budget, offload=CHEAP)
    assert p.offloaded
    m = _measure.measure_step(p.apply(loss), *args, target="tpu-v5e")
    # Host buffers hold at least the offloaded bytes (the TPU pads small arrays to tiles).
    assert m.host_temp_bytes >= p.offloaded_bytes > 0
    base = _measure.measure_step(autoremat.plan(loss, *args, budget=budget).apply(loss),
                                 *args, target="tpu-v5e")
    assert base.host_temp_bytes == 0
    # In the compiled program each offloaded value is written, iteration by iteration, into
    # a stacked buffer in host memory (memory space 5) by an asynchronous
    # dynamic-update-slice in the scan's loop body.
    device = _measure._device("tpu-v5e")
    sharding = jax.sharding.SingleDeviceSharding(device)
    avals = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                         args)
    compiled = jax.jit(jax.grad(p.apply(loss))).lower(*avals).compile()
    text = compiled.as_text()
    host_writes = re.findall(r"S\(5\)\} dynamic-update-slice-done\(", text)
    length = {v.id: p.graph.regions[v.region].length for v in p.graph.values}
    looped = [v for v in p.offloaded if length[v] > 1]
    assert len(host_writes) == len(looped) > 0
    # A scan piece of one iteration is no loop once compiled: its offloaded values are
    # copied to host memory directly.
    if len(looped) < len(p.offloaded):
        assert re.findall(r"S\(5\)\} copy-done\(", text)
    assert compiled.memory_analysis().host_temp_size_in_bytes == m.host_temp_bytes


def _flat(loss, args):
    from autoremat import _rewrite

    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    return flat_fn, avals
