"""Property-based tests on random JAX programs and budgets.

A program is a random DAG over a pool of ``(rows, width)`` activations: elementwise
unary and binary ops, matmuls with weights, reductions broadcast back (a column, or a
reduced row broadcast over the rows), a weight row broadcast as a bias, transposes and
reshape round trips, ``cond``, ``custom_jvp`` (``jax.nn.relu``), two ``custom_vjp`` ops
with their own forward and backward (one keeping a value it computes, one keeping its
inputs), a gather by an integer argument, scales by an integer array leaf and by a
Python float leaf, and scans over a weight stack (with a ``tanh``, ``custom_vjp`` or
reshape body), in float32, bfloat16, or bfloat16 weights with float32 activations.

The arguments are ``(params, x, perm)``: ``params`` nests the weights, the weight stack,
an int32 array and a Python float in random dicts, lists and tuples; ``perm`` is an int32
array that is not differentiated. Gradients are taken as JAX takes them, with respect to
``params`` and ``x`` with ``allow_int=True`` (integer leaves get ``float0`` zeros).

For each program and a random budget between the floor and the no-remat peak: the
optimized function has the original's output and gradient types (dtypes and weak types)
and its gradients, the predicted saved bytes equal what JAX saves
(``saved_residuals``), the plan fits its own memory model, planning twice gives the
same plan, and planning warns of nothing (no residual it cannot count, no primitive
without a cost). Two fixed programs (``EVERY_OP``, ``BRANCHING``) put every op in the
quick profile whatever hypothesis draws.

The default run tries a quick profile (the two fixed programs and 8 drawn, under a
minute); ``pytest -m slow -n 0 tests/test_fuzz.py -s`` runs 500 programs and prints the
counts of programs and failures.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import traceback
import warnings
from typing import Any

import autoremat_ilp as ilp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import autoremat
from autoremat import _solve
from tests.models import fits_under_the_model, saved_residuals

WIDTH, ROWS, STACK = 8, 4, 3
UNARY = {"tanh": jnp.tanh, "sin": jnp.sin, "relu": jax.nn.relu, "square": jnp.square,
         "sigmoid": jax.nn.sigmoid}
BINARY = {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract}


@jax.custom_vjp
def soft_clip(x: jax.Array) -> jax.Array:
    """``x / (1 + |x|)``; its forward keeps a value it computes."""
    return x / (1 + jnp.abs(x))


def _soft_clip_fwd(x):
    d = 1 + jnp.abs(x)
    return x / d, d


def _soft_clip_bwd(d, g):
    return (g / (d * d),)


soft_clip.defvjp(_soft_clip_fwd, _soft_clip_bwd)


@jax.custom_vjp
def gate(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a * sigmoid(b)``; its forward keeps an input and a computed value."""
    return a * jax.nn.sigmoid(b)


def _gate_fwd(a, b):
    s = jax.nn.sigmoid(b)
    return a * s, (a, s)


def _gate_bwd(res, g):
    a, s = res
    return g * s, g * a * s * (1 - s)


gate.defvjp(_gate_fwd, _gate_bwd)


def _reshape_op(name: str, a: jax.Array, w: jax.Array) -> jax.Array:
    """Reshape round trips: each leaves ``a``'s shape as it found it."""
    if name == "split_rows":  # (R, W) -> (2R, W/2), a matmul there, and back
        h = WIDTH // 2
        return (a.reshape(ROWS * 2, h) @ w[:h, :h]).reshape(ROWS, WIDTH)
    if name == "split_cols":  # (R, W) -> (R, 2, W/2), mix the halves, and back
        b = a.reshape(ROWS, 2, WIDTH // 2)
        return (b * jnp.sin(b[:, ::-1, :])).reshape(ROWS, WIDTH)
    return jnp.tanh(a.reshape(-1)).reshape(ROWS, WIDTH)  # flatten


def _row_op(name: str, a: jax.Array, w: jax.Array) -> jax.Array:
    """Broadcasts of a row over the rows: a reduced row, or a weight row as a bias."""
    if name == "mean_row":
        return a - jnp.mean(a, axis=0)
    if name == "max_row":
        return a * jnp.broadcast_to(jnp.max(a, axis=0, keepdims=True), a.shape)
    return a + w[0].astype(a.dtype)  # bias_row


SCAN_BODIES = ("tanh", "custom_vjp", "reshape")


def _scan_body(name: str):
    def body(c, s):
        h = c @ s.astype(c.dtype)
        if name == "custom_vjp":
            h = soft_clip(h)
        elif name == "reshape":
            h = jnp.sin(h.reshape(ROWS * WIDTH // 2, 2)).reshape(ROWS, WIDTH)
        else:
            h = jnp.tanh(h)
        return h, None

    return body


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    name: str
    inputs: tuple[int, ...]
    weight: int = 0


# Kinds with a name of their variant; the rest are named by their kind.
VARIANTS = {"unary": sorted(UNARY), "binary": sorted(BINARY),
            "reshape": ["split_rows", "split_cols", "flatten"],
            "row": ["mean_row", "max_row", "bias_row"], "scan": list(SCAN_BODIES)}
KINDS = ["unary", "binary", "matmul", "reduce", "transpose", "reshape", "row", "cond",
         "scan", "soft_clip", "gate", "gather", "int_scale", "py_scale"]
TWO_INPUTS = {"binary", "gate"}


@dataclasses.dataclass(frozen=True)
class Program:
    ops: tuple[Op, ...]
    dtype: str  # "float32", "bfloat16", or "mixed" (bfloat16 weights, float32 activations)
    n_weights: int
    layout: Any  # a pytree of labels: "w0".., "stack", "k" (int32 array), "s" (float)

    @property
    def act_dtype(self) -> str:
        return "float32" if self.dtype == "mixed" else self.dtype

    @property
    def weight_dtype(self) -> str:
        return "bfloat16" if self.dtype == "mixed" else self.dtype


@st.composite
def layouts(draw: st.DrawFn, labels: list[str], depth: int = 0) -> Any:
    """``labels`` nested at random in dicts, lists and tuples (each label once)."""
    if len(labels) == 1 and (depth >= 3 or draw(st.booleans())):
        return labels[0]
    kind = draw(st.sampled_from(["dict", "list", "tuple"]))
    n = draw(st.integers(1, min(3, len(labels))))
    cuts = sorted(draw(st.lists(st.integers(1, len(labels) - 1), min_size=n - 1,
                                max_size=n - 1, unique=True))) if n > 1 else []
    bounds = [0, *cuts, len(labels)]
    children = [draw(layouts(labels[a:b], depth + 1)) for a, b in itertools.pairwise(bounds)]
    if kind == "dict":
        keys = draw(st.permutations([f"k{i}" for i in range(len(children))]))
        return dict(zip(keys, children, strict=True))
    return children if kind == "list" else tuple(children)


@st.composite
def programs(draw: st.DrawFn, max_ops: int = 12) -> Program:
    n_weights = draw(st.integers(1, 3))
    ops = []
    for i in range(draw(st.integers(2, max_ops))):
        pick = st.integers(0, i)  # value 0 is the input activation
        kind = draw(st.sampled_from(KINDS))
        name = draw(st.sampled_from(VARIANTS[kind])) if kind in VARIANTS else kind
        inputs = tuple(draw(pick) for _ in range(2 if kind in TWO_INPUTS else 1))
        ops.append(Op(kind, name, inputs, draw(st.integers(0, n_weights - 1))))
    dtype = draw(st.sampled_from(["float32", "bfloat16", "mixed"]))
    labels = draw(st.permutations([f"w{i}" for i in range(n_weights)] + ["stack", "k", "s"]))
    return Program(tuple(ops), dtype, n_weights, draw(layouts(list(labels))))


def _paths(layout: Any) -> dict[str, tuple]:
    """Each label's path (keys and indices) in ``layout``."""
    if isinstance(layout, str):
        return {layout: ()}
    items = layout.items() if isinstance(layout, dict) else enumerate(layout)
    return {label: (k, *path) for k, child in items for label, path in _paths(child).items()}


def _fill(layout: Any, values: dict[str, Any]) -> Any:
    if isinstance(layout, str):
        return values[layout]
    if isinstance(layout, dict):
        return {k: _fill(v, values) for k, v in layout.items()}
    return type(layout)(_fill(v, values) for v in layout)


def _get(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def build(program: Program):
    """The program's loss and its arguments ``(params, x, perm)``."""
    ops, act, wdt = program.ops, program.act_dtype, program.weight_dtype
    keys = jax.random.split(jax.random.key(len(ops)), program.n_weights + 4)
    values = {f"w{i}": (jax.random.normal(keys[i], (WIDTH, WIDTH)) / 3).astype(wdt)
              for i in range(program.n_weights)}
    values["stack"] = (jax.random.normal(keys[-4], (STACK, WIDTH, WIDTH)) / 3).astype(wdt)
    values["k"] = jax.random.randint(keys[-3], (WIDTH,), 1, 4, dtype=jnp.int32)
    values["s"] = 0.75  # a Python float leaf: weakly typed, as JAX treats it
    params = _fill(program.layout, values)
    x = jax.random.normal(keys[-2], (ROWS, WIDTH)).astype(act)
    perm = jax.random.permutation(keys[-1], WIDTH).astype(jnp.int32)
    paths = _paths(program.layout)

    def loss(params, x, perm):
        vals = [x]
        readers = set()
        for op in ops:
            a = vals[op.inputs[0]]
            readers.update(op.inputs)
            w = _get(params, paths[f"w{op.weight}"])
            if op.kind == "unary":
                v = UNARY[op.name](a)
            elif op.kind == "binary":
                v = BINARY[op.name](a, vals[op.inputs[1]])
            elif op.kind == "matmul":
                v = a @ w.astype(a.dtype)
            elif op.kind == "reduce":
                v = a - jnp.mean(a * a, axis=-1, keepdims=True)
            elif op.kind == "transpose":
                v = (a.T * 2).T
            elif op.kind == "reshape":
                v = _reshape_op(op.name, a, w.astype(a.dtype))
            elif op.kind == "row":
                v = _row_op(op.name, a, w)
            elif op.kind == "cond":
                v = jax.lax.cond(jnp.sum(a) > 0, lambda t: jnp.sin(t) * t, jnp.cos, a)
            elif op.kind == "soft_clip":
                v = soft_clip(a)
            elif op.kind == "gate":
                v = gate(a, vals[op.inputs[1]])
            elif op.kind == "gather":
                v = jnp.take(a, perm, axis=1)
            elif op.kind == "int_scale":
                v = a * _get(params, paths["k"]).astype(a.dtype)
            elif op.kind == "py_scale":
                v = a * _get(params, paths["s"])
            else:
                v, _ = jax.lax.scan(_scan_body(op.name), a, _get(params, paths["stack"]))
            vals.append(v.astype(act))
        sinks = [v for i, v in enumerate(vals) if i not in readers]
        return sum(jnp.sum(v ** 2) for v in sinks)

    return loss, (params, x, perm)


def _grads(fn, args):
    """Gradients as JAX takes them: with respect to ``params`` and ``x``, integer leaves
    allowed (their gradients are ``float0``)."""
    return jax.grad(fn, argnums=(0, 1), allow_int=True)(*args)


def _types(tree) -> list:
    return [(a.shape, a.dtype, getattr(a, "weak_type", False)) for a in jax.tree.leaves(tree)]


def check_program(program: Program, fraction: float) -> None:
    loss, args = build(program)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            autoremat.plan(loss, *args, budget=1)
            raise AssertionError("a 1-byte budget cannot be feasible")
        except autoremat.InfeasibleBudgetError as e:
            floor = e.floor_bytes
        top = autoremat.plan(loss, *args, budget=1.0).no_remat_peak_bytes
        budget = int(floor + fraction * (top - floor))
        plan = autoremat.plan(loss, *args, budget=budget)
    # No residuals JAX keeps that autoremat cannot count, no primitive without a cost.
    assert [str(w.message) for w in record if "autoremat" in str(w.message)
            or "JAX keeps" in str(w.message)] == []
    assert plan.budget_bytes == budget and fits_under_the_model(plan)
    assert plan == autoremat.plan(loss, *args, budget=budget)

    problem = _solve.problem_of(plan.graph)
    ids = plan.graph.array("id")
    save, recompute = np.isin(ids, list(plan.saved)), np.isin(ids, list(plan.recomputed))
    assert ilp.violations(problem, save, recompute) == []
    # The model's figure: where regions run as written, the lower of the saved values' peak
    # and what the compiler holds of them (_solve.evaluate).
    assert _solve.evaluate(plan.graph, problem, save, recompute)[1] == plan.peak_bytes

    optimized = plan.apply(loss)
    actual = sum(int(np.prod(a.shape)) * a.dtype.itemsize
                 for a, src in saved_residuals(optimized, *args)
                 if not src.startswith("from the argument"))
    assert plan.saved_bytes == actual

    # The optimized function is the same function to JAX: same output and gradient types.
    assert _types(jax.eval_shape(optimized, *args)) == _types(jax.eval_shape(loss, *args))
    g0 = jax.jit(lambda *a: _grads(loss, a))(*args)
    g1 = jax.jit(lambda *a: _grads(optimized, a))(*args)
    assert jax.tree.structure(g0) == jax.tree.structure(g1)
    assert _types(g0) == _types(g1)
    tol = 2e-2 if "bfloat16" in (program.act_dtype, program.weight_dtype) else 1e-5
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        if not jnp.issubdtype(a.dtype, jnp.inexact):
            continue  # float0 gradients of integer leaves
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol * float(np.max(np.abs(a), initial=1)))


def _chain(*kinds_and_names: str) -> tuple[Op, ...]:
    """Ops each reading the previous value (``kind`` or ``kind:name``)."""
    ops = []
    for i, spec in enumerate(kinds_and_names):
        kind, _, name = spec.partition(":")
        ops.append(Op(kind, name or kind, (i, i - 1) if kind in TWO_INPUTS else (i,), i % 2))
    return tuple(ops)


# Every kind and variant at least once, whatever hypothesis draws.
EVERY_OP = Program(
    _chain("matmul", "soft_clip", "gate", "reshape:split_rows", "reshape:split_cols",
           "reshape:flatten", "row:mean_row", "row:max_row", "row:bias_row", "scan:custom_vjp",
           "scan:reshape", "scan:tanh", "gather", "int_scale", "py_scale", "cond", "reduce",
           "transpose", "unary:relu", "binary:mul", "unary:sigmoid"),
    "bfloat16", 2, {"a": ["w0", ("stack", {"b": "k"})], "c": ("s", "w1")})
BRANCHING = Program(
    (Op("matmul", "matmul", (0,), 1), Op("py_scale", "py_scale", (0,)),
     Op("gate", "gate", (1, 2)), Op("scan", "custom_vjp", (1,)), Op("int_scale", "int_scale", (2,)),
     Op("binary", "sub", (4, 5)), Op("gather", "gather", (3,)), Op("reshape", "split_rows", (6,))),
    "mixed", 2, ("s", ["w1", "k"], {"w": "w0", "stack": ("stack",)}))

# Found by the quick profile: its floor is one remat per layer with the code around the
# layers as written, whose model peak is what the compiler holds of that code.
AROUND_AS_WRITTEN = Program(
    (Op("reshape", "split_rows", (0,)), Op("soft_clip", "soft_clip", (0,)),
     Op("py_scale", "py_scale", (0,)), Op("int_scale", "int_scale", (1,)),
     Op("reshape", "split_rows", (2,))),
    "float32", 1, {"k0": ({"k0": "w0"}, "stack", {"k0": "s"}), "k1": "k"})


_SETTINGS = {"deadline": None, "derandomize": True, "database": None,
             "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


@settings(max_examples=8, **_SETTINGS)
@given(programs(max_ops=8), st.floats(0.0, 1.0))
@example(EVERY_OP, 0.0)
@example(BRANCHING, 0.3)
@example(AROUND_AS_WRITTEN, 0.0)
def test_random_programs_quick(program, fraction):
    check_program(program, fraction)


LONG_EXAMPLES = 500


@pytest.mark.slow
def test_random_programs_long():
    """500 programs; a failing program is recorded and the run goes on, so that the
    counts of programs and failures are printed; the test then fails if any failed."""
    failures: list[str] = []
    count = 0
    start = time.perf_counter()

    @settings(max_examples=LONG_EXAMPLES, **_SETTINGS)
    @given(programs(), st.floats(0.0, 1.0))
    def run(program, fraction):
        nonlocal count
        count += 1
        try:
            check_program(program, fraction)
        except Exception as e:  # noqa: BLE001 - recorded and reported below
            failures.append(f"{program!r}, fraction={fraction!r}:\n"
                            + "".join(traceback.format_exception_only(e)).strip())
        print(f"\rprograms checked: {count}, failures: {len(failures)}", end="", flush=True)

    run()
    print(f"\nfuzz long profile: {count} programs, {len(failures)} failures, "
          f"{time.perf_counter() - start:.0f} s")
    assert count >= LONG_EXAMPLES
    assert not failures, "\n\n".join(failures[:5])
