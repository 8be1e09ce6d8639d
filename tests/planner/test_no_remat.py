"""The plan that recomputes nothing is the function as written (``Plan.no_remat``)."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat._planner import PlanOptions, _candidates
from autoremat._planner._candidates import (
    MODEL_ERROR,
    NEAR_NO_REMAT,
    SolverClock,
    candidates,
)
from autoremat._planner._floor import floor_plans
from autoremat._planner._search import search
from autoremat._report import format_report
from autoremat._rewrite import flat_function
from tests.models import MODELS, saved_residuals


def _loss(w, x):
    for _ in range(3):
        x = jnp.tanh(x @ w)
    # log_softmax is a jitted function inside the loss: JAX keeps scalar literals for it.
    return -jnp.mean(jax.nn.log_softmax(x)[:, 0])


def _args():
    return jnp.ones((32, 32)) / 32, jnp.linspace(-1.0, 1.0, 16 * 32).reshape(16, 32)


def _kept_bytes(fn, *args) -> int:
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, src in saved_residuals(fn, *args)
               if not src.startswith("from the argument"))


@pytest.fixture(scope="module")
def no_remat():
    w, x = _args()
    return autoremat.plan(_loss, w, x, budget="1GiB")


def test_a_budget_above_no_remat_runs_the_function_as_written(no_remat):
    w, x = _args()
    assert no_remat.no_remat and no_remat.recompute_flops == 0
    step = lambda f: str(jax.make_jaxpr(jax.grad(f))(w, x))
    assert step(no_remat.apply(_loss)) == step(_loss)  # no checkpoint added


def test_its_saved_bytes_are_what_jax_keeps_for_the_function(no_remat):
    w, x = _args()
    assert no_remat.saved_bytes == _kept_bytes(no_remat.apply(_loss), w, x)


def _wide_loss(w1, w2, x):
    for _ in range(4):
        x = jnp.tanh(x @ w1) @ w2  # each layer keeps a dot's result 8 times wider than x
    return jnp.mean(x ** 2)


def test_a_plan_below_no_remat_is_not_the_function_as_written():
    args = jnp.ones((32, 256)) / 32, jnp.ones((256, 32)) / 256, jnp.ones((64, 32))
    nothing = autoremat.plan(_wide_loss, *args, budget="1GiB")
    floor = autoremat.plan(_wide_loss, *args, budget="floor")
    assert nothing.no_remat and floor.peak_bytes < nothing.peak_bytes and not floor.no_remat


def test_the_floor_is_the_function_as_written_where_the_model_holds_it_lowest(no_remat):
    # XLA fuses each tanh into the backward, keeping the dots' results: no checkpointed
    # plan holds less, and none recomputes less.
    floor = autoremat.plan(_loss, *_args(), budget="floor")
    assert floor.no_remat and floor.peak_bytes == no_remat.peak_bytes


def test_it_still_checks_the_program(no_remat):
    with pytest.raises(autoremat.PlanMismatchError):
        no_remat.apply(_loss)(*(jnp.ones((8, 8)),) * 2)


def test_a_policy_file_keeps_it(no_remat, tmp_path):
    w, x = _args()
    path = os.fspath(tmp_path / "plan.json")
    no_remat.save(path)
    loaded = autoremat.load_plan(path, _loss, w, x)
    assert loaded.no_remat and loaded.saved_bytes == no_remat.saved_bytes
    assert "runs as written" in format_report(autoremat.PolicyFile.read(path))
    assert "runs as written" in no_remat.report()


def test_a_policy_file_of_the_floor_as_written_loads_with_its_peak(tmp_path):
    floor = autoremat.plan(_loss, *_args(), budget="floor")
    path = os.fspath(tmp_path / "floor.json")
    floor.save(path)
    loaded = autoremat.load_plan(path, _loss, *_args())
    assert floor.no_remat and loaded.no_remat and loaded.peak_bytes == floor.peak_bytes


@pytest.fixture(scope="module")
def near_no_remat():
    """transformer_block planned without verify at 95% of its modelled no-remat activation
    memory: the plan the search finds there, and what ``plan`` returns."""
    fn, args = MODELS["transformer_block"]()
    top = autoremat.plan(fn, *args, budget=1.0, verify=None)
    fixed = top.graph.fixed_bytes
    budget = fixed + int(0.95 * (top.no_remat_peak_bytes - fixed))
    options = PlanOptions(verify=None)
    flat_fn, _, avals, _ = flat_function(fn, args, {})
    found = candidates(flat_fn, avals, options)
    # The search's own plan, as the closed loop gets it: with verify it stands as it is.
    searched = search(found, budget, dataclasses.replace(options, verify="tpu-v5e"),
                      SolverClock.of(options, len(found)))
    return fn, args, budget, searched, autoremat.plan(fn, *args, budget=budget, verify=None)


def test_near_no_remat_the_function_as_written_stands_for_the_checkpointed_plan(
        near_no_remat):
    fn, args, budget, searched, planned = near_no_remat
    fixed = searched.graph.fixed_bytes
    # The search's plan fits under the model, recomputes almost nothing, and the model
    # puts it within its error of the function as written.
    assert not searched.no_remat and searched.peak_bytes <= budget
    assert 0 < searched.recompute_flops <= NEAR_NO_REMAT * searched.step_flops
    assert searched.peak_bytes - fixed >= (1 - MODEL_ERROR) * (
        searched.no_remat_peak_bytes - fixed)
    # So the function as written is the plan: over the budget by less than that error.
    assert planned.no_remat and planned.recompute_flops == 0
    assert planned.budget_bytes == budget < planned.peak_bytes
    assert (1 - MODEL_ERROR) * (planned.peak_bytes - fixed) <= budget - fixed
    assert planned.peak_bytes == searched.no_remat_peak_bytes
    step = lambda f: str(jax.make_jaxpr(jax.grad(f))(*args))
    assert step(planned.apply(fn)) == step(fn)
    assert "over the budget" in planned.report()


def test_below_the_models_error_of_no_remat_the_plan_fits_the_budget(near_no_remat):
    fn, args, _, searched, _ = near_no_remat
    fixed = searched.graph.fixed_bytes
    budget = fixed + int(0.8 * (searched.no_remat_peak_bytes - fixed))
    planned = autoremat.plan(fn, *args, budget=budget, verify=None)
    assert not planned.no_remat and planned.peak_bytes <= budget


def test_a_policy_file_of_the_function_as_written_over_its_budget_loads(near_no_remat,
                                                                         tmp_path):
    fn, args, _, _, planned = near_no_remat
    path = os.fspath(tmp_path / "near.json")
    planned.save(path)
    loaded = autoremat.load_plan(path, fn, *args)
    assert loaded.no_remat and loaded.peak_bytes == planned.peak_bytes
    assert loaded.budget_bytes == planned.budget_bytes


def test_the_floor_is_the_function_as_written_where_the_model_cannot_tell_them_apart(
        monkeypatch):
    fn, args = MODELS["mlp"]()
    options = PlanOptions(verify=None)
    flat_fn, _, avals, _ = flat_function(fn, args, {})
    found = candidates(flat_fn, avals, options)
    solved = floor_plans(found, options, SolverClock.of(options, len(found)))[0]
    fixed = solved.graph.fixed_bytes
    assert not solved.no_remat and solved.peak_bytes < solved.no_remat_peak_bytes
    # A model error larger than the solved floor's activation memory gain on no remat.
    error = 1 - (solved.peak_bytes - fixed) / (solved.no_remat_peak_bytes - fixed) + 0.01
    monkeypatch.setattr(_candidates, "MODEL_ERROR", error)
    written, *floors = floor_plans(found, options, SolverClock.of(options, len(found)))
    assert written.no_remat and written.peak_bytes == solved.no_remat_peak_bytes
    assert [p.peak_bytes for p in floors][:1] == [solved.peak_bytes]
