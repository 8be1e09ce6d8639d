"""Tracing: effects, unknown primitives, structure."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import autoremat
from autoremat import _program, _rewrite, _trace
from autoremat._placement import Placement
from autoremat._trace import _graph_builder
from autoremat._trace._residuals import JaxAnswers, RegionAnswer
from autoremat._trace._signature import Signature
from autoremat._trace._values import ValueFacts


def _graph(fn, *args):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    return _trace.trace(flat_fn, avals)[2]


def _program_of(fn, *args):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    return _trace.trace_program(flat_fn, avals)


def test_debug_print_warns_that_it_runs_again_and_gradients_hold():
    def loss(w):
        h = jnp.tanh(w * 2.0)
        jax.debug.print("h {}", h.sum())
        return jnp.sum(jnp.sin(h))

    w = jnp.linspace(0.0, 1.0, 8)
    with pytest.warns(UserWarning, match="runs again"):
        plan = autoremat.plan(loss, w, budget=1.0)
    np.testing.assert_allclose(jax.grad(plan.apply(loss))(w), jax.grad(loss)(w), rtol=1e-6)


def test_io_callback_is_a_clear_error():
    def loss(w):
        y = io_callback(lambda a: a, jax.ShapeDtypeStruct(w.shape, w.dtype), w)
        return jnp.sum(y * w)

    with pytest.raises(autoremat.UnsupportedProgramError, match="io_callback at .*test_trace.py"):
        autoremat.plan(loss, jnp.ones(4), budget=1.0)


def test_scan_values_are_counted_per_iteration_and_invariants_once():
    def loss(w, xs):
        def body(c, x):
            mask = jnp.tril(jnp.ones((4, 4)))          # loop-invariant
            return jnp.tanh(c @ (w * mask) + x), None
        c, _ = jax.lax.scan(body, jnp.zeros(4), xs)
        return jnp.sum(c)

    g = _graph(loss, jnp.ones((4, 4)), jnp.ones((5, 4)))
    scan_region = next(r for r in g.regions if r.kind == "scan")
    assert scan_region.length == 5
    body = [v for v in g.values if v.region == scan_region.index and v.primitive == "tanh"]
    assert [v.multiplicity for v in body] == [5]
    invariant = [v for v in g.values if v.region == scan_region.index and v.shape == (4, 4)
                 and v.primitive == "mul"]
    assert invariant and all(v.multiplicity == 1 for v in invariant)


def test_flops_of_a_matmul_and_the_step():
    g = _graph(lambda w, x: jnp.sum(x @ w), jnp.ones((8, 16)), jnp.ones((4, 8)))
    dot = next(v for v in g.values if v.primitive == "dot_general")
    assert dot.flops == 2 * 4 * 16 * 8
    # forward dot, plus two dots in the backward pass (one per operand)
    assert g.step_flops >= 3 * dot.flops


def test_unknown_primitive_gets_a_warning_and_a_conservative_cost():
    from autoremat._cost import eqn_flops

    aval = jax.core.ShapedArray((10,), jnp.float32)
    with pytest.warns(UserWarning, match="no cost model for primitive 'mystery_op'"):
        assert eqn_flops("mystery_op", {}, [aval], [aval]) == 200


def test_cotangents_of_elementwise_chains_fuse_and_those_of_dots_materialize():
    x = jnp.ones((64, 256))

    def elementwise(x):  # three equations: one region
        return jnp.sum(jnp.exp(jnp.sin(x)))

    def matmuls(w, x):
        return jnp.sum((x @ w) @ w)

    g = _graph(elementwise, x)
    assert max(r.cotangent_bytes for r in g.regions) == 4  # the scalar output's alone
    g = _graph(matmuls, jnp.ones((256, 256)), x)
    # The cotangents of x @ w (read by a dot) and of x (read by a dot) exist.
    assert max(r.cotangent_bytes for r in g.regions) >= x.nbytes


def test_argument_gradients_appear_at_the_last_region_reading_them():
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    ws = [jnp.ones((128, 128)) / 128 for _ in range(8)]
    g = _graph(loss, ws, jnp.ones((64, 128)))
    grads = [r.grad_bytes for r in g.regions]
    assert len(grads) > 2
    assert grads == sorted(grads, reverse=True)
    assert grads[0] == g.grad_bytes and grads[-1] < g.grad_bytes


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_random_keys_inside_the_step_are_planned(make_key):
    def loss(w, x, key):
        h = jnp.tanh(x @ w)
        h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0)
        return jnp.sum(jnp.tanh(h @ w) ** 2)

    w, x, key = jnp.ones((64, 64)) / 64, jnp.ones((128, 64)), make_key(0)
    plan = autoremat.plan(loss, w, x, key, budget=1.0)
    np.testing.assert_allclose(jax.grad(plan.apply(loss))(w, x, key), jax.grad(loss)(w, x, key),
                               rtol=1e-6)


def test_a_scan_counts_the_gradient_accumulators_of_a_constant_read_later():
    """Each loop sums the gradient of a weight it closes over in a buffer of its own, and
    the sums are added after the last: in a loop's backward, the accumulator of every
    later loop reading the weight is live beside its own."""

    def loop(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0]

    w, x = jnp.ones((64, 64)), jnp.ones((8, 64))
    graph = _graph(lambda w, x: jnp.sum(loop(w, loop(w, loop(w, x)))), w, x)
    first, second, third = (r.cotangent_bytes for r in graph.regions if r.kind == "scan")
    assert (first - third, second - third) == (2 * w.nbytes, w.nbytes)


def _layers(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return jnp.sum(x)


def _loop(w, xs):
    return jnp.sum(jax.lax.scan(lambda c, x: (jnp.tanh(c @ w + x), None), jnp.zeros(16), xs)[0])


def test_a_repeated_layer_is_asked_of_jax_once_and_a_second_placement_asks_nothing(
        monkeypatch):
    program = _program_of(_layers, [jnp.ones((64, 64)) / 64 for _ in range(6)],
                          jnp.ones((32, 64)))
    asked = []
    ask_jax = _graph_builder.ask_jax
    monkeypatch.setattr(_graph_builder, "ask_jax", lambda *a: asked.append(a[1]) or ask_jax(*a))
    facts = _trace.program_facts(program)
    placement = Placement(_trace.segment_cuts(program))
    regions, graph = _trace.graph_of(program, placement, facts)
    # One region per layer; the first reads the argument x, the last ends in the sum.
    assert len(regions) == 6
    assert [r.index for r in asked] == [0, 5] and len(facts.answers) == 2
    assert _trace.graph_of(program, placement, facts)[1] == graph
    assert len(asked) == 2


def test_the_answer_for_a_region_is_a_typed_record_of_the_values_its_vjp_reads():
    program = _program_of(_layers, [jnp.ones((64, 64)) / 64 for _ in range(3)],
                          jnp.ones((32, 64)))
    facts = _trace.program_facts(program)
    regions, graph = _trace.graph_of(program, Placement(_trace.segment_cuts(program)), facts)
    needed = {v.id for v in graph.values if v.needed}
    for r in regions:
        signature = facts.texts.sign(r)
        answer = facts.answers.ask(signature, lambda: pytest.fail("asked again"))
        assert isinstance(answer, RegionAnswer)
        made = set(_trace._common.produced(r.eqns))
        assert set(signature.ids(answer.needed)) == needed & made
        assert answer.step_flops > 0 and answer.unplanned_bytes == 0
    assert graph.step_flops == sum(
        facts.answers.ask(facts.texts.sign(r), pytest.fail).step_flops for r in regions)


def test_jax_answers_ask_once_per_signature_text():
    answers = JaxAnswers()
    answer = RegionAnswer(needed=(2,), inputs_read=(0,), unplanned_bytes=0, step_flops=10,
                          fixed_flops=1)
    assert answers.ask(Signature("f32[4]\nexp(%0)", {7: 0, 8: 1}), lambda: answer) is answer
    assert answers.ask(Signature("f32[4]\nexp(%0)", {3: 0, 4: 1}), pytest.fail) is answer
    assert len(answers) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.step_flops = 0


def test_equal_regions_sign_equally_with_their_own_positions():
    program = _program_of(_layers, [jnp.ones((64, 64)) / 64 for _ in range(4)],
                          jnp.ones((32, 64)))
    facts = _trace.program_facts(program)
    regions, _ = _trace.graph_of(program, Placement(_trace.segment_cuts(program)), facts)
    first, second = (facts.texts.sign(r) for r in regions[1:3])
    assert first.text == second.text
    assert [first.positions[i] for i in regions[1].inputs] == list(range(2))
    # Position by position, each region's own values.
    assert set(first.ids(range(len(first.positions)))) == set(first.positions)
    assert set(first.positions).isdisjoint(set(second.positions) - set(regions[2].inputs))


def test_value_facts_are_what_no_placement_changes():
    program = _program_of(_loop, jnp.ones((16, 16)) / 16, jnp.ones((16, 16)))
    assert _program.scan_groups_of(program) == (4,)
    facts = _trace.program_facts(program)
    assert all(isinstance(f, ValueFacts) for f in facts.values.values())
    plain = Placement(_trace.segment_cuts(program))
    nested = dataclasses.replace(plain, scan_groups=(4,))
    _, graph = _trace.graph_of(program, nested, facts)
    body = [v for v in graph.values if v.primitive in ("dot_general", "tanh")]
    assert all(v.replayed and v.multiplicity == 4 for v in body)
    assert all(facts.values[v.id].multiplicity == 16 for v in body)
    # The nested graph left the shared values' facts as they were.
    assert _trace.graph_of(program, plain, facts)[1].values == \
        _trace.graph_of(program, plain)[1].values
    for v in graph.values:
        f = facts.values[v.id]
        assert (v.shape, v.dtype, v.nbytes, v.primitive, v.source, v.flops, v.inputs,
                v.recomputable, v.user_name) == (f.shape, f.dtype, f.nbytes, f.primitive,
                                                 f.source, f.flops, f.inputs,
                                                 f.recomputable, f.user_name)
