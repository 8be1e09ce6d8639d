"""Property-based tests on random JAX programs and budgets.

A program is a random DAG over a pool of ``(rows, width)`` activations: elementwise
unary and binary ops, matmuls with weights, reductions broadcast back, transposes
round trips, ``cond``, ``custom_jvp`` (``jax.nn.relu``) and scans over a weight stack,
in float32 or bfloat16. For each program and a random budget between the floor and the
no-remat peak: the gradients equal the original's, the predicted saved bytes equal what
JAX saves, the plan fits its own memory model, and planning twice gives the same plan.

The default run tries a quick profile; ``pytest -m slow tests/test_fuzz.py -s`` runs 500
programs and prints the counts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from autoremat_solvers import policy as policy_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax._src.ad_checkpoint import saved_residuals

import autoremat
from autoremat import _solve

WIDTH, ROWS = 8, 4
UNARY = {"tanh": jnp.tanh, "sin": jnp.sin, "relu": jax.nn.relu, "square": jnp.square,
         "sigmoid": jax.nn.sigmoid}
BINARY = {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract}


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    name: str
    inputs: tuple[int, ...]
    weight: int = 0


@st.composite
def programs(draw: st.DrawFn) -> tuple[tuple[Op, ...], str, int]:
    n_weights = draw(st.integers(1, 3))
    ops = []
    for i in range(draw(st.integers(2, 12))):
        pool = i + 1  # value 0 is the input activation
        pick = st.integers(0, pool - 1)
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "reduce", "transpose",
                                     "cond", "scan"]))
        if kind == "unary":
            ops.append(Op(kind, draw(st.sampled_from(sorted(UNARY))), (draw(pick),)))
        elif kind == "binary":
            ops.append(Op(kind, draw(st.sampled_from(sorted(BINARY))), (draw(pick), draw(pick))))
        else:
            ops.append(Op(kind, kind, (draw(pick),), draw(st.integers(0, n_weights - 1))))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    return tuple(ops), dtype, n_weights


def build(ops: tuple[Op, ...], dtype: str, n_weights: int):
    keys = jax.random.split(jax.random.key(len(ops)), n_weights + 2)
    params = {"w": [(jax.random.normal(keys[i], (WIDTH, WIDTH)) / 3).astype(dtype)
                    for i in range(n_weights)],
              "stack": (jax.random.normal(keys[-2], (3, WIDTH, WIDTH)) / 3).astype(dtype)}
    x = jax.random.normal(keys[-1], (ROWS, WIDTH)).astype(dtype)

    def loss(params, x):
        vals = [x]
        for op in ops:
            a = vals[op.inputs[0]]
            w = params["w"][op.weight]
            if op.kind == "unary":
                v = UNARY[op.name](a)
            elif op.kind == "binary":
                v = BINARY[op.name](a, vals[op.inputs[1]])
            elif op.kind == "matmul":
                v = a @ w
            elif op.kind == "reduce":
                v = a - jnp.mean(a * a, axis=-1, keepdims=True)
            elif op.kind == "transpose":
                v = (a.T * 2).T
            elif op.kind == "cond":
                v = jax.lax.cond(jnp.sum(a) > 0, lambda t: jnp.sin(t) * t, jnp.cos, a)
            else:
                v, _ = jax.lax.scan(lambda c, s: (jnp.tanh(c @ s), None), a, params["stack"])
            vals.append(v.astype(dtype))
        return jnp.sum(vals[-1].astype(jnp.float32) ** 2)

    return loss, (params, x)


def check_program(ops, dtype, n_weights, fraction) -> None:
    loss, args = build(ops, dtype, n_weights)
    try:
        autoremat.plan(loss, *args, budget=1)
        raise AssertionError("a 1-byte budget cannot be feasible")
    except autoremat.InfeasibleBudgetError as e:
        floor = e.floor_bytes
    top = autoremat.plan(loss, *args, budget=1.0).no_remat_peak_bytes
    budget = int(floor + fraction * (top - floor))
    plan = autoremat.plan(loss, *args, budget=budget)
    assert plan.peak_bytes <= budget
    assert plan == autoremat.plan(loss, *args, budget=budget)

    problem = _solve.to_problem(plan.graph)
    ids = plan.graph.array("id")
    save, recompute = np.isin(ids, list(plan.saved)), np.isin(ids, list(plan.recomputed))
    assert policy_model.violations(problem, save, recompute) == []
    assert policy_model.evaluate(problem, save, recompute)[1] == plan.peak_bytes

    optimized = plan.apply(loss)
    actual = sum(int(np.prod(a.shape)) * a.dtype.itemsize
                 for a, src in saved_residuals(optimized, *args)
                 if not src.startswith("from the argument"))
    assert plan.saved_bytes == actual
    g0 = jax.tree.leaves(jax.grad(loss)(*args))
    g1 = jax.tree.leaves(jax.jit(jax.grad(optimized))(*args))
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    for a, b in zip(g0, g1, strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol * float(np.max(np.abs(a), initial=1)))


_SETTINGS = {"deadline": None, "derandomize": True,
                 "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@settings(max_examples=15, **_SETTINGS)
@given(programs(), st.floats(0.0, 1.0))
def test_random_programs_quick(program, fraction):
    check_program(*program, fraction)


@pytest.mark.slow
@settings(max_examples=500, **_SETTINGS)
@given(programs(), st.floats(0.0, 1.0))
def test_random_programs_long(program, fraction):
    check_program(*program, fraction)
    test_random_programs_long.count = getattr(test_random_programs_long, "count", 0) + 1
    print(f"\rprograms checked: {test_random_programs_long.count}", end="", flush=True)
