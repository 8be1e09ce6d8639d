"""autoremat on the corpus's third-party models (``bench/corpus``, small variants): plans
keep the gradients, save what they say, and the floor is at or below the user's own line."""

from __future__ import annotations

import autoremat_ilp as ilp
import jax
import numpy as np
import pytest

import autoremat
from autoremat import _measure, _rewrite, _solve
from autoremat._layout import array_bytes
from autoremat._planner import PlanOptions
from autoremat._planner._candidates import (
    SolverClock,
    candidates,
    obvious_plans,
    within_model_error,
)
from autoremat._planner._floor import floor_plans
from bench import corpus
from tests.models import saved_residuals

TINY = sorted(name for name in corpus.CORPUS if name.endswith("-tiny"))


def _kept_bytes(fn, *args, layout="dense") -> int:
    return sum(array_bytes(a.shape, a.dtype.itemsize, layout)
               for a, src in saved_residuals(fn, *args) if not src.startswith("from the argument"))


def _grads(fn, args):
    """The gradients as a training step takes them: under ``jit``."""
    return jax.jit(jax.grad(fn, argnums=_measure.float_argnums(args)))(*args)


@pytest.fixture(scope="module", params=TINY)
def model(request):
    m = corpus.get(request.param)
    params, batch = m.init(jax.random.key(0))
    return m, m.make_loss(), (params, batch)


@pytest.fixture(scope="module")
def floor(model):
    """The model's floor plan."""
    _, loss, args = model
    return autoremat.plan(loss, *args, budget="floor")


def test_the_corpus_has_every_library():
    libraries = {name.split("-")[0] for name in TINY}
    assert {"linen", "nnx", "eqx", "keras", "penzai", "haiku"} <= libraries, corpus.MISSING


def test_floor_is_at_or_below_no_remat_and_one_remat_per_layer(model, floor):
    _, loss, args = model
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    no_remat, *per_layer = obvious_plans(candidates(flat_fn, avals, PlanOptions()),
                                         PlanOptions())
    for p in (no_remat, *per_layer):
        assert p.graph is not None
        ids = p.graph.array("id")
        assert ilp.violations(_solve.problem_of(p.graph), np.isin(ids, list(p.saved)),
                              np.isin(ids, list(p.recomputed))) == []
    lowest = min(p.peak_bytes for p in (no_remat, *per_layer))
    # The function as written stands first where the model cannot tell it from the rest
    # (autoremat._planner._floor.floor_plans); every other floor is at or below them all.
    assert floor.peak_bytes <= lowest or (
        floor.no_remat and within_model_error(lowest, floor.peak_bytes, floor.graph.fixed_bytes))


def test_without_verify_the_floor_is_one_remat_per_layer_where_the_model_cannot_tell():
    """The full-size Flax Linen encoder (traced, not compiled): the solved floor is
    modelled under one remat per layer by less than the model's error; compiled for TPU
    v5e it came out above it, which compiles at the hand baseline's peak
    (``bench/results/corpus-no-verify/``), so the floor is one remat per layer."""
    m = corpus.get("linen-encoder")
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    plan = autoremat.plan(loss, *args, budget="floor")
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    found = candidates(flat_fn, avals, PlanOptions())
    per_layer = obvious_plans(found, PlanOptions())[2]
    assert (plan.placement, plan.saved) == (per_layer.placement, per_layer.saved)
    _, solved, *_ = floor_plans(found, PlanOptions(), SolverClock.of(PlanOptions(), len(found)))
    assert plan.graph is not None and solved.peak_bytes < plan.peak_bytes
    assert within_model_error(solved.peak_bytes, plan.peak_bytes, plan.graph.fixed_bytes)


@pytest.mark.parametrize("budget", ["floor", "middle"])
def test_plans_keep_the_gradients_and_save_what_they_say(model, floor, budget):
    _, loss, args = model
    # The floor, or halfway from the floor to no remat.
    plan = floor if budget == "floor" else autoremat.plan(
        loss, *args, budget=(floor.peak_bytes + floor.no_remat_peak_bytes) // 2)
    optimized = plan.apply(loss)
    assert plan.saved_bytes == _kept_bytes(optimized, *args)
    for a, b in zip(jax.tree.leaves(_grads(optimized, args)), jax.tree.leaves(_grads(loss, args)),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("budget", ["floor", 2**40])
def test_saved_bytes_count_what_jax_keeps_in_the_plans_layout(model, budget):
    """In TPU tiles too: where a plan runs code as written (the function itself, at no
    remat), the bytes of what JAX keeps there are counted in tiles like the plan's own."""
    _, loss, args = model
    plan = autoremat.plan(loss, *args, budget=budget, layout="tiled")
    assert plan.saved_bytes == _kept_bytes(plan.apply(loss), *args, layout="tiled")


def test_one_remat_per_layer_keeps_the_gradients_and_saves_what_it_says(model):
    """The per-layer plan leaves the code around the layers as written (no checkpoint):
    there JAX keeps what its own rules read, which the plan counts."""
    _, loss, args = model
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    *_, per_layer = obvious_plans(candidates(flat_fn, avals, PlanOptions()), PlanOptions())
    optimized = per_layer.apply(loss)
    assert per_layer.saved_bytes == _kept_bytes(optimized, *args)
    for a, b in zip(jax.tree.leaves(_grads(optimized, args)), jax.tree.leaves(_grads(loss, args)),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.slow  # full-size compiles of Keras's CNN; needs the TPU compiler
def test_below_the_models_floor_nothing_recomputes_where_the_function_as_written_fits():
    # On TPU v5e the chip keeps every temporary of this CNN on-chip: the function as
    # written and the model's floor plan (recomputing 30%) both compile at the step's
    # arguments and outputs, 11.9 MiB, where the model puts its floor at 61 MiB.
    m = corpus.get("keras-cnn")
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    argnums = _measure.float_argnums(args)
    as_written = autoremat.measure_step(loss, *args, argnums=argnums).peak_bytes
    assert autoremat.plan(loss, *args, budget="floor").peak_bytes > as_written
    p = autoremat.plan(loss, *args, budget=as_written, verify="tpu-v5e")
    assert p.verified_peak_bytes <= as_written and p.recompute_flops == 0
