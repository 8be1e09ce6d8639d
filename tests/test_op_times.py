"""Measured operation times as the recompute cost (``plan(..., op_times=...)``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _cost, _solve
from tests.models import MODELS


@pytest.fixture(scope="module")
def gpt2():
    loss, args = MODELS["gpt2_unrolled"]()
    return loss, args, autoremat.measure_op_times(loss, *args, repeats=3)


def test_times_cover_the_materializing_values_and_round_trip_as_json(gpt2):
    loss, args, times = gpt2
    plan = autoremat.plan(loss, *args, budget=1.0)
    assert times.fingerprint == plan.graph.fingerprint and times.backend == jax.default_backend()
    timed = {v.id for v in plan.graph.values if not _cost.fusible(v.primitive)
             and v.recomputable}
    assert timed <= set(times.seconds) and all(s >= 0 for s in times.seconds.values())
    assert not any(_cost.fusible(v.primitive) for v in plan.graph.values
                   if v.id in times.seconds)
    assert autoremat.OpTimes.from_json(times.to_json()) == times


def test_measured_costs_keep_flops_for_fused_values_and_scale_the_rest(gpt2):
    loss, args, times = gpt2
    graph = autoremat.plan(loss, *args, budget=1.0).graph
    by_flops = _solve.problem_of(graph).cost
    by_time = _solve.problem_of(graph, times).cost
    timed = np.array([v.id in times.seconds for v in graph.values])
    np.testing.assert_array_equal(by_flops[~timed], by_time[~timed])
    # Scaled to the measured rate: the timed values' total is their FLOPs' total.
    flops = graph.recompute_flops()
    moved = by_flops - flops  # the tie-breaks, the same in both
    assert (by_time - moved)[timed].sum() == pytest.approx(flops[timed].sum(), rel=1e-6)


def test_plan_with_measured_times_is_valid_and_deterministic():
    loss, args = MODELS["norm_mlp"]()
    times = autoremat.measure_op_times(loss, *args, repeats=3)
    plan = autoremat.plan(loss, *args, budget=0.6, op_times=times)
    assert plan == autoremat.plan(loss, *args, budget=0.6, op_times=times)
    assert plan.peak_bytes <= plan.budget_bytes
    expected = jax.grad(loss)(*args)
    actual = jax.grad(plan.apply(loss))(*args)
    for g0, g1 in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-6)


def test_times_of_another_program_are_refused():
    loss, args = MODELS["mlp"]()
    times = autoremat.measure_op_times(loss, *args, repeats=1)
    other = lambda w, x: jnp.sum(jnp.tanh(x @ w))
    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    with pytest.raises(ValueError, match="measured for another program"):
        autoremat.plan(other, w, x, budget=0.5, op_times=times)
