"""Bad inputs and failure modes: each with its own, specific error or warning.

Policy files (corrupted, tampered, wrong version, foreign) are covered in
``tests/test_policy_file.py``; budget parsing alone in ``tests/test_budget.py``.
"""

from __future__ import annotations

import math
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

import autoremat
from autoremat import _cost
from autoremat._budget import ACCEPTED_FORMS, format_bytes
from autoremat._planner import _api
from tests.models import MODELS

W = jax.random.normal(jax.random.key(0), (16, 16)) / 4
X = jax.random.normal(jax.random.key(1), (8, 16))


def mlp(w, x):
    for _ in range(3):
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def _close(actual, expected, rtol=1e-5):
    for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if jnp.issubdtype(a.dtype, jnp.inexact):
            b32 = np.asarray(b, np.float32)
            np.testing.assert_allclose(np.asarray(a, np.float32), b32, rtol=rtol,
                                       atol=rtol * float(np.max(np.abs(b32), initial=1)))


@pytest.fixture
def count_plans(monkeypatch):
    """The plans made (by ``optimize`` and ``plan``), in order (``None`` for a call that
    raised)."""
    made: list[autoremat.Plan | None] = []
    real = _api.plan_with

    def counting(*args, **kwargs):
        made.append(None)
        made[-1] = real(*args, **kwargs)
        return made[-1]

    monkeypatch.setattr(_api, "plan_with", counting)
    return made


# -- budgets ---------------------------------------------------------------------------

@pytest.mark.parametrize("budget, reason", [
    ("lots", "is malformed"), ("6G", "is malformed"), ("", "is malformed"),
    (0, "is not positive"), (-5, "is not positive"), ("-1GiB", "is below one byte"),
    ("0 GiB", "is below one byte"), (0.0, "is not a fraction in (0, 1]"),
    (-0.1, "is not a fraction in (0, 1]"), (1.5, "is not a fraction in (0, 1]"),
    (float("nan"), "is not a fraction in (0, 1]"), (True, "is a bool"),
    (None, "has type NoneType"), ([1], "has type list"),
])
def test_bad_budget_is_a_value_error_naming_the_accepted_forms(budget, reason):
    expected = f"budget {budget!r} {reason}; expected {ACCEPTED_FORMS}"
    with pytest.raises(ValueError) as info:
        autoremat.optimize(mlp, budget=budget)  # refused at once, before any call
    assert str(info.value) == expected
    with pytest.raises(ValueError) as info:
        autoremat.plan(mlp, W, X, budget=budget)
    assert str(info.value) == expected
    assert not isinstance(info.value, autoremat.InfeasibleBudgetError)
    assert "'6GiB'" in expected and "(0, 1]" in expected and "int of bytes" in expected


def test_budget_below_the_floor_states_the_floor():
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(mlp, W, X, budget=1)
    error = info.value
    floor = error.floor_bytes
    assert isinstance(error, ValueError) and error.budget_bytes == 1 and floor > 1
    assert str(error) == (
        f"no remat plan fits a budget of 1 bytes ({format_bytes(1)}); the smallest feasible "
        f"budget is {floor} bytes ({format_bytes(floor)}). Raise the budget, shrink the "
        "batch, or shard the step.")
    # The floor is the smallest budget that works, whatever form the budget took.
    assert autoremat.plan(mlp, W, X, budget=floor).peak_bytes <= floor
    for budget in (floor - 1, "1KiB", 1e-9):
        with pytest.raises(autoremat.InfeasibleBudgetError) as info:
            autoremat.plan(mlp, W, X, budget=budget)
        assert info.value.floor_bytes == floor
        assert f"the smallest feasible budget is {floor} bytes" in str(info.value)


# -- arguments that are not differentiable ----------------------------------------------

def _mixed_loss(params, x, perm):
    """Reads an int32 array argument (a gather), an int32 leaf, a Python float leaf and a
    Python int leaf; ``params`` also holds a ``None``."""
    h = jnp.take(x, perm, axis=1) @ params["w"]
    h = jnp.tanh(h) * params["int"]["k"].astype(h.dtype) * params["scale"]
    h = jnp.sin(h @ params["w"]) + params["int"]["offset"]
    return jnp.sum(h ** 2)


def _mixed_args(dtype):
    params = {"w": W.astype(dtype), "scale": 0.5, "none": None,
              "int": {"k": jnp.arange(16, dtype=jnp.int32) % 3, "offset": 2}}
    return params, X.astype(dtype), jnp.arange(16, dtype=jnp.int32)[::-1]


def _types(tree):
    return [(a.shape, a.dtype, getattr(a, "weak_type", False)) for a in jax.tree.leaves(tree)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_integer_and_python_leaves_are_handled_as_jax_does(dtype):
    args = _mixed_args(dtype)
    plan = autoremat.plan(_mixed_loss, *args, budget=_floor(_mixed_loss, args))
    optimized = plan.apply(_mixed_loss)
    # Same program to JAX: the Python float is weakly typed (bfloat16 stays bfloat16).
    assert _types(jax.eval_shape(optimized, *args)) == _types(jax.eval_shape(_mixed_loss, *args))
    grad = lambda f: jax.grad(f, argnums=(0, 1), allow_int=True)(*args)
    g0, g1 = grad(_mixed_loss), grad(optimized)
    assert jax.tree.structure(g0) == jax.tree.structure(g1) and _types(g0) == _types(g1)
    _close(g1, g0, rtol=2e-2 if dtype == "bfloat16" else 1e-5)
    assert g1[0]["int"]["k"].dtype == jax.dtypes.float0  # as JAX gives integer leaves
    # Differentiating an integer argument is refused exactly as JAX refuses it.
    with pytest.raises(TypeError) as expected:
        jax.grad(_mixed_loss, argnums=2)(*args)
    with pytest.raises(TypeError) as actual:
        jax.grad(optimized, argnums=2)(*args)
    assert str(actual.value) == str(expected.value)
    assert "grad requires real- or complex-valued inputs" in str(actual.value)


def test_optimize_with_python_scalars_and_integer_arguments():
    args = _mixed_args("bfloat16")
    optimized = autoremat.optimize(_mixed_loss, budget=_floor(_mixed_loss, args) * 2)
    grad = lambda f, *a: jax.jit(jax.grad(f, argnums=(0, 1), allow_int=True))(*a)
    _close(grad(optimized, *args), grad(_mixed_loss, *args), rtol=2e-2)
    # The same structure with a strongly typed float32 array where the Python float was:
    # another program (bfloat16 * float32 is float32), so another plan, not a mismatch.
    params, x, perm = args
    strong = ({**params, "scale": jnp.float32(0.5)}, x, perm)
    assert jax.eval_shape(optimized, *strong).dtype == jnp.float32
    _close(grad(optimized, *strong), grad(_mixed_loss, *strong), rtol=2e-2)


def test_leaf_jax_cannot_trace_is_jax_s_type_error():
    loss = lambda p, x: jnp.sum(x * p["w"])
    params = {"w": X, "name": "layer"}
    with pytest.raises(TypeError, match="Argument 'layer' of type <class 'str'> is not a "
                       "valid JAX type"):
        jax.grad(loss)(params, X)
    with pytest.raises(TypeError, match="Argument 'layer' of type <class 'str'> is not a "
                       "valid JAX type"):
        autoremat.plan(loss, params, X, budget=1.0)
    # As a static argument, it is a value of the program, as under jax.jit.
    loss = lambda x, name: jnp.sum(jnp.tanh(x) ** (2 if name == "layer" else 3))
    optimized = autoremat.optimize(loss, budget=1.0, static_argnums=1)
    _close(jax.grad(optimized)(X, "layer"), jax.grad(loss)(X, "layer"))
    _close(jax.grad(optimized)(X, "other"), jax.grad(loss)(X, "other"))


# -- effects ----------------------------------------------------------------------------

def _printing_loss(where):
    def loss(w, x):
        h = jnp.tanh(x @ w)
        if where == "top":
            jax.debug.print("h {}", h.sum())
        elif where == "cond":
            h = jax.lax.cond(h.sum() > 0, lambda a: (jax.debug.print("a {}", a.sum()), a)[1],
                             jnp.cos, h)
        else:
            def body(c, _):
                jax.debug.print("c {}", c.sum())
                return jnp.tanh(c @ w), None
            h, _ = jax.lax.scan(body, h, None, length=2)
        return jnp.sum(jnp.sin(h @ w) ** 2)
    return loss


@pytest.mark.parametrize("where", ["top", "cond", "scan"])
def test_debug_print_warns_that_it_runs_again(where):
    loss = _printing_loss(where)
    optimized = autoremat.optimize(loss, budget=1.0)
    with pytest.warns(UserWarning, match=r"debug_print at .*test_errors\.py:\d+ runs again "
                      "when autoremat recomputes its region in the backward pass"):
        g1 = jax.grad(optimized)(W, X)
    _close(g1, jax.grad(loss)(W, X))


def _callback_loss(where):
    def call(a):
        return io_callback(lambda b: b, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    @jax.custom_vjp
    def logged(a):
        return call(a)

    logged.defvjp(lambda a: (call(a), None), lambda _, g: (g,))

    def loss(w, x):
        h = jnp.tanh(x @ w)
        if where == "top":
            h = call(h)
        elif where == "cond":
            h = jax.lax.cond(h.sum() > 0, call, jnp.cos, h)
        elif where == "custom_vjp":
            h = logged(h)
        else:  # a scan in a scan
            h, _ = jax.lax.scan(lambda c, _: (jax.lax.scan(
                lambda d, _: (call(d) * 0.5, None), c, None, length=2)[0], None),
                h, None, length=2)
        return jnp.sum(h @ w)
    return loss


@pytest.mark.parametrize("where", ["top", "cond", "nested_scan", "custom_vjp"])
def test_io_callback_is_a_clear_error(where):
    loss = _callback_loss(where)
    if where == "custom_vjp":
        jax.grad(loss)(W, X)  # JAX differentiates it; jax.checkpoint cannot replay it
    with pytest.raises(autoremat.UnsupportedProgramError, match=(
            r"io_callback at .*test_errors\.py:\d+ is a side effect that jax.checkpoint "
            r"cannot replay in the backward pass \(even inside a jax.custom_vjp\), so its "
            "step cannot be planned; move it out of the differentiated function.")):
        jax.grad(autoremat.optimize(loss, budget=1.0))(W, X)


def test_pure_callback_is_a_clear_error_unless_it_has_a_rule():
    def call(a):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    with pytest.raises(autoremat.UnsupportedProgramError, match=(
            r"pure_callback at .*test_errors\.py:\d+ has no derivative in JAX, so its step "
            "cannot be planned; wrap it in jax.custom_vjp, or move it out of the "
            "differentiated function.")):
        autoremat.plan(lambda w, x: jnp.sum(call(x @ w)), W, X, budget=1.0)

    @jax.custom_vjp
    def sin(a):
        return call(a)

    sin.defvjp(lambda a: (call(a), a), lambda a, g: (g * jnp.cos(a),))
    loss = lambda w, x: jnp.sum(sin(jnp.tanh(x @ w)) @ w)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "autoremat has no cost model")
        _close(jax.grad(autoremat.optimize(loss, budget=1.0))(W, X), jax.grad(loss)(W, X))


# -- unknown primitives ------------------------------------------------------------------

def _wobble_impl(x):
    return jnp.sin(x) + x


wobble_p = Primitive("autoremat_test_wobble")
wobble_p.def_impl(_wobble_impl)
wobble_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(wobble_p, mlir.lower_fun(_wobble_impl, multiple_results=False))
ad.defjvp(wobble_p, lambda g, x: g * (jnp.cos(x) + 1))


@pytest.mark.parametrize("name, op", [
    ("autoremat_test_wobble", wobble_p.bind),       # a primitive of our own
    ("bessel_i1e", jax.scipy.special.i1e),          # a JAX primitive missing from the tables
])
def test_unknown_primitive_gets_a_conservative_cost_and_a_warning(monkeypatch, name, op):
    monkeypatch.setattr(_cost, "_warned", set())  # it warns once per primitive and process

    def loss(w, x):
        return jnp.sum(jnp.tanh(op(x @ w) @ w) ** 2)

    with pytest.warns(UserWarning) as record:
        plan = autoremat.plan(loss, W, X, budget=1.0)
    # (A JAX primitive's derivative may bring more unknown primitives: one warning each.)
    messages = [str(r.message) for r in record if f"primitive {name!r}" in str(r.message)]
    assert messages == [(f"autoremat has no cost model for primitive {name!r}; assuming a "
                         "conservative 10 FLOPs per element read or written.")]
    (value,) = [v for v in plan.graph.values if v.primitive == name]
    assert value.flops == 10 * (X.size + X.size)  # ten FLOPs per element in and out
    _close(jax.grad(plan.apply(loss))(W, X), jax.grad(loss)(W, X))
    _close(jax.jit(jax.grad(plan.apply(loss)))(W, X), jax.grad(loss)(W, X))


# -- solver time limit -------------------------------------------------------------------

def test_solver_time_limit_gives_the_best_plan_or_a_timeout():
    loss, args = MODELS["gpt2_unrolled"]()  # about 400 values: seconds to solve on 2 cores
    floor = _floor(loss, args)
    budget = (floor + autoremat.plan(loss, *args, budget=1.0).budget_bytes) // 2
    try:
        with pytest.warns(UserWarning, match="time limit stopped a search .* may differ"):
            plan = autoremat.plan(loss, *args, budget=budget, time_limit_s=0.01)
    except autoremat.SolverTimeoutError as e:
        assert str(e) == (f"the solver found no plan within 0.01 s for a budget of "
                          f"{format_bytes(budget)}; raise time_limit_s or the budget.")
    else:
        assert plan.status == "feasible" and math.isfinite(plan.gap) and plan.gap >= 0
        assert plan.peak_bytes <= plan.budget_bytes == budget


def _floor(loss, args) -> int:
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1)
    return info.value.floor_bytes


# -- failure modes -----------------------------------------------------------------------

def test_failed_solve_leaves_no_partial_state(count_plans):
    optimized = autoremat.optimize(mlp, budget=1)
    errors = []
    for _ in range(2):
        with pytest.raises(autoremat.InfeasibleBudgetError) as info:
            jax.grad(optimized)(W, X)
        errors.append(info.value)
    assert str(errors[0]) == str(errors[1])
    assert errors[0].floor_bytes == errors[1].floor_bytes
    assert count_plans == [None, None]  # nothing cached: the second call planned again
    feasible = autoremat.optimize(mlp, budget=errors[0].floor_bytes)
    _close(jax.jit(jax.grad(feasible))(W, X), jax.grad(mlp)(W, X))
    assert len(count_plans) == 3 and count_plans[-1].peak_bytes <= errors[0].floor_bytes


def test_plan_cache_is_keyed_by_structure_shapes_dtypes_and_static_values(count_plans):
    traces = []

    def reference(w, x, power):
        for _ in range(3):
            x = jnp.sin(x @ w)
        return jnp.sum(x ** power)

    def loss(w, x, power):
        traces.append(x.shape)
        return reference(w, x, power)

    optimized = autoremat.optimize(loss, budget="1MiB", static_argnums=2)
    bf16 = (W.astype(jnp.bfloat16), X.astype(jnp.bfloat16), 2)
    calls = [(W, X, 2), (W, X, 2), (W, X[:4], 2), (W, X, 3), bf16, (W, X, 2), (W, X[:4], 2),
             bf16]
    planned, traced = [], []
    for args in calls:
        before = len(traces)
        _close(jax.grad(optimized)(*args), jax.grad(reference)(*args), rtol=2e-2)
        planned.append(len(count_plans))
        traced.append(len(traces) - before)
    # New shapes, static values and dtypes are planned; repeats reuse their plan, and
    # only the rewrite traces the function again (once).
    assert planned == [1, 1, 2, 3, 4, 4, 4, 4]
    assert [t == 1 for t in traced] == [False, True, False, False, False, True, True, True]
    # Other budgets, the same shapes: other plans.
    floor = _floor(reference, (W, X, 2))
    for budget in (floor, 1.0):
        jax.grad(autoremat.optimize(loss, budget=budget, static_argnums=2))(W, X, 2)
    at_floor, no_remat = count_plans[-2:]
    assert at_floor.budget_bytes == floor and at_floor.recompute_flops > 0
    assert no_remat.recompute_flops == 0 and at_floor.saved != no_remat.saved


def test_threads_share_one_plan_and_get_equal_results(count_plans):
    loss, (params, x) = MODELS["mlp"]()
    budget = (_floor(loss, (params, x))
              + autoremat.plan(loss, params, x, budget=1.0).budget_bytes) // 2
    optimized = autoremat.optimize(loss, budget=budget)
    before = len(count_plans)  # autoremat.plan made some to find the budget
    step = jax.jit(jax.value_and_grad(optimized))
    barrier = threading.Barrier(8)
    results: list = [None] * 8
    errors: list = []

    def worker(i):
        try:
            barrier.wait()
            eager = jax.grad(optimized)(params, x)
            results[i] = (eager, step(params, x))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(count_plans) == before + 1  # traced and planned once, under the lock
    first = jax.tree.leaves(results[0])
    for r in results[1:]:
        for a, b in zip(first, jax.tree.leaves(r), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    expected = jax.value_and_grad(loss)(params, x)
    _close(results[0][1], expected)
