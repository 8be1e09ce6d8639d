"""End-to-end properties of plan / optimize on small models."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import autoremat_ilp as ilp
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _benchmark, _measure, _program, _rewrite, _solve, _trace
from autoremat._layout import array_bytes
from autoremat._placement import Placement
from autoremat._planner import _candidates, _search
from autoremat._planner._floor import floor_plans
from autoremat._sites import decisions_of
from tests.models import MODELS, saved_residuals


@pytest.fixture(params=[False, True], ids=["remat2", "remat3"])
def remat3(request):
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", request.param)
    yield request.param
    jax.config.update("jax_remat3", old)


def _grads(fn, args):
    """Gradients with respect to every argument whose leaves are all floating point."""
    argnums = tuple(i for i, a in enumerate(args)
                    if all(jnp.issubdtype(x.dtype, jnp.inexact) for x in jax.tree.leaves(a)))
    return jax.tree.leaves(jax.grad(fn, argnums=argnums)(*args))


def _assert_close(expected, actual):
    scale = float(np.max(np.abs(expected), initial=0.0))
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale)


def _recomputed_flops(fn, optimized, args) -> int:
    """FLOPs JAX's gradient of ``optimized`` spends beyond ``fn``'s (dead code dropped)."""
    argnums = _measure.float_argnums(args)
    return (_benchmark.program_flops(optimized, *args, argnums=argnums)
            - _benchmark.program_flops(fn, *args, argnums=argnums))


def _actual_saved_bytes(fn, args) -> int:
    """Bytes of residuals JAX keeps for ``fn``'s VJP, arguments excluded."""
    return sum(int(np.prod(aval.shape)) * aval.dtype.itemsize
               for aval, source in saved_residuals(fn, *args)
               if not source.startswith("from the argument") and source != "from a constant")


# Every budget with JAX's default remat; the new implementation (jax_remat3) at one budget
# by default, at the others with ``-m slow``.
_BUDGETS_AND_REMAT = [
    pytest.param(budget, remat3, id=f"remat{2 + remat3}-{budget}",
                 marks=[pytest.mark.slow] if remat3 and budget != 0.5 else [])
    for remat3 in (False, True) for budget in (1.0, 0.5, 0.15)]


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("budget, remat3", _BUDGETS_AND_REMAT, indirect=["remat3"])
def test_gradients_and_saved_bytes(model, budget, remat3):
    loss, args = MODELS[model]()
    try:
        plan = autoremat.plan(loss, *args, budget=budget)
    except autoremat.InfeasibleBudgetError as e:
        plan = autoremat.plan(loss, *args, budget=e.floor_bytes)
    assert plan.peak_bytes <= plan.budget_bytes
    optimized = plan.apply(loss)
    # Regions run as compiled computations, which XLA fuses differently from the original
    # and so reassociates float32 sums: allow a few ulps of the gradient's largest entry.
    expected = jax.jit(lambda *a: _grads(loss, a))(*args)
    for g0, g1 in zip(expected, _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    for g0, g1 in zip(expected, jax.jit(lambda *a: _grads(optimized, a))(*args), strict=True):
        _assert_close(g0, g1)
    assert plan.saved_bytes == _actual_saved_bytes(optimized, args)
    # What the plan says it recomputes bounds what JAX recomputes, closely: the tiny GPT-2s
    # and the CNN match exactly; one sine and one product of norm_mlp's planned recompute
    # JAX does not repeat (12%). Read on the jaxpr, where jax_remat3 does not show the
    # recomputation.
    if not remat3:
        recomputed = _recomputed_flops(loss, optimized, args)
        assert recomputed <= plan.recompute_flops <= 1.15 * recomputed


def test_an_operation_whose_jvp_reads_its_output_has_that_output_saved():
    # exp's and tanh's JVPs read their outputs. Named after the operation, the output the
    # JVP reads would be the unnamed one, which no name policy saves: JAX would keep the
    # input and run exp and tanh again in the backward pass, unplanned.
    w, x = jnp.ones((32, 32)) / 32, jnp.ones((16, 32))
    loss = lambda w, x: jnp.sum(jnp.tanh(jnp.exp(x @ w) @ w))
    plan = autoremat.plan(loss, w, x, budget=1.0)
    optimized = plan.apply(loss)
    saved = {v.primitive for v in plan.graph.values if v.id in plan.saved}
    assert {"exp", "tanh"} <= saved
    assert plan.recompute_flops == 0 == _recomputed_flops(loss, optimized, (w, x))
    assert plan.saved_bytes == _actual_saved_bytes(optimized, (w, x))
    _assert_close(jax.grad(loss)(w, x), jax.grad(optimized)(w, x))


def _scan_with_a_row_statistic() -> tuple[Callable, tuple[jax.Array, jax.Array]]:
    """A scan saving a per-row norm statistic in each of its iterations."""
    def loss(ws: jax.Array, x: jax.Array) -> jax.Array:
        def layer(h, w):
            y = jnp.tanh(jnp.tanh(h @ w) @ w)
            return y * jax.lax.rsqrt(jnp.sum(y * y, axis=-1, keepdims=True)), None
        return jnp.sum(jax.lax.scan(layer, x, ws)[0])

    return loss, (jax.random.normal(jax.random.key(0), (6, 128, 128)) / 12,
                  jax.random.normal(jax.random.key(1), (2048, 128)))


@pytest.mark.parametrize("budget", [0.5, 1.0])
def test_a_scans_saved_values_are_counted_stacked_as_jax_keeps_them(budget):
    # Saved in 3 iterations: one iteration's f32[2048,1] takes 8 KiB of tiles, but JAX
    # keeps f32[3,2048,1], whose 3 rows pad to 4: 32 KiB, not 3 x 8.
    loss, args = _scan_with_a_row_statistic()
    plan = autoremat.plan(loss, *args, budget=budget, layout="tiled")
    kept = [a for a, src in saved_residuals(plan.apply(loss), *args)
            if not src.startswith("from the argument")]
    assert any(a.shape[0] > 1 and sum(d > 1 for d in a.shape[1:]) < 2 for a in kept)
    assert plan.saved_bytes == sum(array_bytes(a.shape, a.dtype.itemsize, "tiled")
                                   for a in kept)


def test_a_plans_saved_decisions_hold_its_saved_bytes():
    """The report's and the policy file's rows count a scan's saved values stacked too."""
    loss, args = _scan_with_a_row_statistic()
    plan = autoremat.plan(loss, *args, budget=0.5, layout="tiled")
    assert any(plan.graph.values[i].multiplicity > 1 for i in plan.saved)
    decisions = decisions_of(plan.graph, plan.actions)
    assert plan.saved_bytes == sum(d.count * d.held_bytes for d in decisions
                                   if d.action == "save")


def test_value_and_grad_under_jit_and_optimize():
    loss, args = MODELS["gpt2_unrolled"]()
    optimized = autoremat.optimize(loss, budget=0.6)
    v0, g0 = jax.jit(jax.value_and_grad(loss))(*args)
    v1, g1 = jax.jit(jax.value_and_grad(optimized))(*args)
    np.testing.assert_allclose(v0, v1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        _assert_close(a, b)
    assert jax.tree.structure(g0) == jax.tree.structure(g1)


@pytest.mark.parametrize("model", ["mlp", pytest.param("gpt2_scanned", marks=pytest.mark.slow),
                                   "gpt2_unrolled"])
def test_more_budget_never_more_recompute(model):
    loss, args = MODELS[model]()
    floor = _floor(loss, args)
    top = autoremat.plan(loss, *args, budget=1.0)
    budgets = np.linspace(floor, top.budget_bytes, 6).astype(int)
    flops = [autoremat.plan(loss, *args, budget=int(b)).recompute_flops for b in budgets]
    assert flops == sorted(flops, reverse=True)
    assert flops[0] > 0
    assert flops[-1] == 0


def _eqns(jaxpr: jex.Jaxpr) -> list[jex.JaxprEqn]:
    """The equations of ``jaxpr`` and of the jaxprs nested in it, outer first."""
    out = []
    for eqn in jaxpr.eqns:
        out.append(eqn)
        for sub in jex.jaxprs_in_params(eqn.params):
            out.extend(_eqns(sub))
    return out


@pytest.mark.parametrize("budget", [0.1, 0.75])
def test_recomputing_behind_a_barrier_keeps_every_input_of_the_segment(budget):
    # Recomputing a value that reads a segment's input replays the segment's input barrier,
    # and JAX then keeps all of the barrier's operands, here a normalization statistic
    # whose own consumer is saved. On the finest placement (a cut inside each layer, so
    # that the statistics cross into the next segment) the plan saves such an input.
    loss, args = MODELS["norm_mlp"]()
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    program = _trace.trace_program(flat_fn, avals)
    graph = _trace.graph_of(program, Placement(_trace.segment_cuts(program)))[1]
    problem = _solve.problem_of(graph)
    floor = ilp.solve_min_peak(problem).peak
    no_remat = _solve.no_remat(graph, problem).peak_bytes
    budget_bytes = int(floor + budget * (no_remat - floor))
    decisions = _solve.decisions(graph, problem, ilp.solve(problem, budget_bytes))
    plan = _candidates.plan_of(graph, decisions, budget_bytes, no_remat,
                               autoremat.PlanOptions(verify=None))
    values = {v.id: v for v in graph.values}
    kept_by_barrier = [
        i for r in graph.regions for i in r.barrier_inputs
        if i in plan.saved and not values[i].needed_across
        and not any(i in values[u].inputs for u in plan.recomputed)]
    assert kept_by_barrier
    assert plan.saved_bytes == _actual_saved_bytes(plan.apply(loss), args)


def test_each_segment_hands_out_its_input_cotangents_at_once():
    # JAX transposes an optimization barrier over a region's inputs into one over their
    # cotangents, so the region's whole backward (weight gradients included) runs before
    # the backward of earlier regions reads any of them: the memory model's stages. (XLA
    # otherwise delayed a Llama head's weight gradient past every layer's backward,
    # keeping its 500 MiB of logits live: 3.8 vs 3.3 GiB on the TPU v5e compiler.)
    loss, args = MODELS["gpt2_unrolled"]()
    chosen = autoremat.plan(loss, *args, budget=_mid_budget(loss, args))
    segments = [e for e in jax.make_jaxpr(chosen.apply(loss))(*args).jaxpr.eqns
                if "prevent_cse" in e.params]
    assert len(segments) == len(chosen.graph.regions) > 1
    for eqn in segments:
        inner = eqn.params["jaxpr"]
        # The barrier sits in a custom JVP that keeps symbolic zero tangents out of it.
        first = inner.eqns[0]
        (barrier,) = first.params["call_jaxpr"].jaxpr.eqns
        assert barrier.primitive.name == "optimization_barrier"
        assert list(first.invars) == list(inner.invars)
    grad_jaxpr = jax.make_jaxpr(jax.grad(chosen.apply(loss)))(*args).jaxpr
    barriers = sum(e.primitive.name == "optimization_barrier" for e in _eqns(grad_jaxpr))
    assert barriers >= 2 * len(segments)


def _floor(loss, args) -> int:
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1)
    return info.value.floor_bytes


@pytest.mark.parametrize("model", ["gpt2_unrolled", "gpt2_scanned"])
def test_the_floor_budget_is_the_least_peak_keeping_the_most_room(model):
    loss, args = MODELS[model]()
    lowest = autoremat.plan(loss, *args, budget="floor")
    assert lowest.peak_bytes == lowest.budget_bytes
    if lowest.peak_bytes != _floor(loss, args):
        # One remat per layer, the solved floors less than the model's error under it, as
        # modelled or with no saved value in the gradients' buffers.
        assert not lowest.placement.barriers and lowest.graph is not None
        options = autoremat.PlanOptions()
        flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
        found = _candidates.candidates(flat_fn, avals, options)
        solved = [f for f in floor_plans(
            found, options, _candidates.SolverClock.of(options, len(found)))
            if f.placement.barriers]
        fixed, unshared = lowest.graph.fixed_bytes, _candidates.unshared_peak
        assert (_candidates.within_model_error(_floor(loss, args), lowest.peak_bytes, fixed)
                or _candidates.within_model_error(min(unshared(f, options) for f in solved),
                                                  unshared(lowest, options), fixed))
    cheapest = autoremat.plan(loss, *args, budget=lowest.budget_bytes)
    # The search ends within its relative gap of the cheapest plan (scanned GPT-2: another
    # placement's plan at the floor, 0.02% dearer than the floor plan).
    assert cheapest.recompute_flops <= lowest.recompute_flops * (1 + _search.OPTIMALITY_GAP)
    if lowest.placement == cheapest.placement:
        # Counting no saved value as packed into the gradients' buffers, it peaks lower.
        assert _unpacked_peak(lowest) <= _unpacked_peak(cheapest)
    optimized = lowest.apply(loss)
    for g0, g1 in zip(_grads(loss, args), _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    assert lowest.saved_bytes == _actual_saved_bytes(optimized, args)


def _unpacked_peak(plan: autoremat.Plan) -> int:
    problem = dataclasses.replace(_solve.problem_of(plan.graph), unshared=None)
    ids = plan.graph.array("id")
    return int(ilp.stage_bytes(problem, np.isin(ids, list(plan.saved)),
                                        np.isin(ids, list(plan.recomputed))).max())


def _mid_budget(loss, args) -> int:
    """Halfway between the floor and the no-remat peak: a plan that saves and recomputes."""
    return (_floor(loss, args) + autoremat.plan(loss, *args, budget=1.0).budget_bytes) // 2


@pytest.mark.parametrize("model", ["mlp", "gpt2_scanned", "cnn"])
def test_floor_is_feasible_and_below_it_is_not(model):
    loss, args = MODELS[model]()
    floor = _floor(loss, args)
    plan = autoremat.plan(loss, *args, budget=floor)
    assert plan.peak_bytes <= floor
    with pytest.raises(autoremat.InfeasibleBudgetError,
                       match=f"smallest feasible budget is {floor} bytes"):
        autoremat.plan(loss, *args, budget=floor - 1)


def test_no_remat_peak_as_budget_gives_zero_recompute():
    loss, args = MODELS["gpt2_unrolled"]()
    reference = autoremat.plan(loss, *args, budget=1.0)
    plan = autoremat.plan(loss, *args, budget=reference.no_remat_peak_bytes)
    assert plan.recompute_flops == 0
    assert plan.overhead == 0.0


def test_same_inputs_same_plan():
    loss, args = MODELS["gpt2_unrolled"]()
    a = autoremat.plan(loss, *args, budget=0.4)
    b = autoremat.plan(loss, *args, budget=0.4)
    assert a == b and hash(a) == hash(b)
    assert a.saved and a.recomputed


def test_plan_works_from_abstract_shapes():
    loss, args = MODELS["mlp"]()
    # weak_type too: the biases (jnp.full(..., 0.1)) are weakly typed, as JAX traces them.
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type),
                          args)
    budget = _mid_budget(loss, args)
    assert (autoremat.plan(loss, *shapes, budget=budget)
            == autoremat.plan(loss, *args, budget=budget))


def test_optimize_plans_per_shape_and_static_args():
    calls = []

    def loss(w, x, power):
        calls.append(x.shape)
        return jnp.sum(jnp.tanh(x @ w) ** power)

    optimized = autoremat.optimize(loss, budget=1.0, static_argnums=2)
    w = jnp.ones((8, 8)) / 8
    for n in (4, 4, 6):
        x = jnp.ones((n, 8))
        np.testing.assert_allclose(jax.grad(optimized)(w, x, 2), jax.grad(loss)(w, x, 2), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(optimized)(w, x, 3), jax.grad(loss)(w, x, 3), rtol=1e-6)


def test_apply_to_other_shapes_is_an_error():
    loss, (params, x) = MODELS["mlp"]()
    plan = autoremat.plan(loss, params, x, budget=1.0)
    with pytest.raises(autoremat.PlanMismatchError, match="autoremat.optimize"):
        plan.apply(loss)(params, x[:3])


def test_report_names_sources_and_totals():
    loss, args = MODELS["gpt2_unrolled"]()
    text = autoremat.plan(loss, *args, budget=0.4).report()
    assert "predicted peak" in text and "overhead" in text
    assert "gpt2.py:" in text
    assert "save" in text and "recompute" in text


def test_policy_saves_exactly_the_plan_names():
    from jax._src.ad_checkpoint import name_p

    loss, args = MODELS["mlp"]()
    plan = autoremat.plan(loss, *args, budget=_mid_budget(loss, args))
    assert plan.saved and plan.recomputed
    aval = jax.core.ShapedArray((2,), jnp.float32)
    for i in plan.saved:
        assert plan.policy(name_p, aval, name=f"autoremat.v{i}")
    for i in plan.recomputed:
        assert not plan.policy(name_p, aval, name=f"autoremat.v{i}")


def test_placement_search_keeps_the_cheapest_placement_and_the_lowest_floor():
    loss, args = MODELS["gpt2_unrolled"]()
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    program = _trace.trace_program(flat_fn, avals)
    candidates = _trace.candidate_cuts(program)
    assert candidates[0] == _trace.segment_cuts(program) and len(set(candidates)) >= 2
    problems = [_solve.problem_of(_trace.graph_of(program, Placement(cuts))[1])
                for cuts in candidates]
    floors = [ilp.solve_min_peak(p).peak for p in problems]
    floor = _floor(loss, args)
    assert floor == min(floors)
    lowest = autoremat.plan(loss, *args, budget=floor)
    assert floors[candidates.index(lowest.placement.cuts)] == floor
    # A coarse placement's plan is applied as planned.
    optimized = lowest.apply(loss)
    for g0, g1 in zip(_grads(loss, args), _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    assert lowest.saved_bytes == _actual_saved_bytes(optimized, args)
    # At a middle budget no placement is cheaper than the chosen one.
    budget = _mid_budget(loss, args)
    chosen = autoremat.plan(loss, *args, budget=budget)
    costs = [ilp.solve(p, chosen.budget_bytes).cost for p in problems]
    assert chosen.recompute_flops <= min(costs) * (1 + 1e-3)


@pytest.mark.parametrize("model", ["gpt2_unrolled", "gpt2_scanned"])
def test_graphs_sharing_program_facts_equal_graphs_made_alone(model):
    loss, args = MODELS[model]()
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    program = _trace.trace_program(flat_fn, avals)
    programs = [program]
    if any(pieces := _program.scan_pieces_of(program)):
        programs.append(_trace.split_program(program, avals, pieces))
    for p in programs:
        facts = _trace.program_facts(p)
        # Coarsest first: the finer placements reuse what the coarser ones asked of JAX.
        for cuts in reversed(_trace.candidate_cuts(p)):
            placement = Placement(cuts, p.scan_pieces)
            assert _trace.graph_of(p, placement, facts)[1] == _trace.graph_of(p, placement)[1]


def test_solver_share_is_what_tracing_left_and_at_least_a_quarter_share():
    share = _candidates.solver_share
    assert share(30.0, 0.0, 3, 3) == 10.0
    assert share(30.0, 6.0, 3, 3) == 8.0  # tracing took 6 s of the solver's 30
    assert share(30.0, 14.0, 2, 3) == 8.0  # an earlier solve ended early
    assert share(30.0, 40.0, 3, 3) == 2.5  # tracing outlasted the limit: the floor
    # Ranked, the first gets what is left less the least share (2.5 s) of each after it.
    assert share(30.0, 6.0, 3, 3, ranked=True) == 19.0
    assert share(30.0, 29.0, 2, 3, ranked=True) == 2.5
    # Solves that take their whole share end with the limit.
    for ranked in (False, True):
        elapsed = 4.0
        for left in (3, 2, 1):
            elapsed += share(30.0, elapsed, left, 3, ranked)
        assert elapsed == pytest.approx(30.0)


@pytest.mark.parametrize("length", range(1, 41))
def test_scan_pieces_add_up_to_every_number_of_iterations(length):
    pieces = _program.scan_pieces(length)
    assert sum(pieces) == length and len(pieces) <= length.bit_length() + 1
    totals = {sum(c) for k in range(len(pieces) + 1) for c in itertools.combinations(pieces, k)}
    assert totals == set(range(length + 1))


def _scanned_residual_mlp(ws: jax.Array, x: jax.Array) -> jax.Array:
    def layer(x, w):
        return x + jnp.sin(jnp.tanh(x @ w[0])) @ w[1], None

    return jnp.sum(jax.lax.scan(layer, x, ws)[0] ** 2)


def _scanned_residual_mlp_program(layers: int) -> tuple[tuple, _program.Program]:
    """Arguments of ``_scanned_residual_mlp`` with ``layers`` layers, and its program."""
    args = (jax.random.normal(jax.random.key(0), (layers, 2, 32, 32)) / 8,
            jax.random.normal(jax.random.key(1), (256, 32)))
    flat_fn, _, avals, _ = _rewrite.flat_function(_scanned_residual_mlp, args, {})
    return args, _trace.trace_program(flat_fn, avals)


def test_split_scans_let_iterations_differ_and_apply_as_planned(tmp_path):
    # Activations much larger than weights: splitting costs little (see test_trace's
    # gradient accumulator test) and lets layers differ.
    loss = _scanned_residual_mlp
    args, program = _scanned_residual_mlp_program(6)
    assert _program.scan_pieces_of(program) == ((1, 2, 3),)
    whole = [_solve.problem_of(_trace.graph_of(program, Placement(cuts))[1])
             for cuts in _trace.candidate_cuts(program)]
    floor, full = _floor(loss, args), autoremat.plan(loss, *args, budget=1.0).peak_bytes
    for fraction in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9):
        chosen = autoremat.plan(loss, *args, budget=int(floor + fraction * (full - floor)))
        if chosen.placement.scan_pieces:
            break
    assert chosen.placement.scan_pieces == ((1, 2, 3),)
    # The split is chosen only where it recomputes less than any whole-scan placement.
    assert chosen.recompute_flops < min(ilp.solve(p, chosen.budget_bytes).cost
                                        for p in whole)
    # Pieces are regions with their own decisions: some iterations save what others do not.
    per_iteration = [sum(v.nbytes for v in chosen.graph.values
                         if v.region == r.index and v.id in chosen.saved)
                     for r in chosen.graph.regions if r.kind == "scan"]
    assert len(per_iteration) == 3 and len(set(per_iteration)) > 1
    optimized = chosen.apply(loss)
    for g0, g1 in zip(_grads(loss, args), _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    assert chosen.saved_bytes == _actual_saved_bytes(optimized, args)
    # Its gradient sums the pieces' weight gradients, once per piece (each piece slices
    # the stacked weights in its region): FLOPs counted in every split plan.
    assert chosen.graph.fixed_flops == (len(chosen.placement.scan_pieces[0]) - 1) * args[0].size
    recomputed = _recomputed_flops(loss, optimized, args)
    assert recomputed <= chosen.recompute_flops <= 1.15 * recomputed
    # XLA inlines a one-iteration loop, so only that piece's recomputation needs
    # protecting from common-subexpression elimination.
    assert {(e.params["length"], c.params["prevent_cse"])
            for e in _eqns(jax.make_jaxpr(optimized)(*args).jaxpr) if e.primitive.name == "scan"
            for c in e.params["jaxpr"].jaxpr.eqns if "prevent_cse" in c.params} == {
        (1, True), (2, False), (3, False)}
    chosen.save(tmp_path / "plan.json")
    loaded = autoremat.load_plan(tmp_path / "plan.json", loss, *args)
    assert (loaded.placement, loaded.saved, loaded.recompute_flops) == (
        chosen.placement, chosen.saved, chosen.recompute_flops)
    assert "scans split into  1+2+3 iterations" in chosen.report()


@pytest.mark.parametrize("length, group", [(1, 1), (3, 1), (4, 2), (7, 1), (9, 3), (12, 3),
                                           (16, 4), (80, 8)])
def test_nest_group_is_the_divisor_nearest_the_square_root(length, group):
    assert _program.nest_group(length) == group


def test_nested_scan_lowers_the_floor_and_applies_as_planned(tmp_path):
    # Nine layers in groups of three keep 3 carries across the step and 3 in a group's
    # backward, instead of 9 (Chen et al. 2016).
    loss = _scanned_residual_mlp
    args, program = _scanned_residual_mlp_program(9)
    assert _program.scan_groups_of(program) == (3,)
    not_nested = min(ilp.solve_min_peak(_solve.problem_of(
        _trace.graph_of(program, Placement(cuts))[1])).peak
        for cuts in _trace.candidate_cuts(program))
    assert autoremat.plan(loss, *args, budget="floor").placement.scan_groups == ()
    lowest = autoremat.plan(loss, *args, budget="floor", nested_scans=True)
    assert lowest.placement.scan_groups == (3,) and lowest.peak_bytes < not_nested
    # Every plan on it runs the layers' forward once more.
    assert lowest.recompute_flops >= _step_forward_flops(loss, args)
    optimized = lowest.apply(loss)
    for g0, g1 in zip(_grads(loss, args), _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    assert lowest.saved_bytes == _actual_saved_bytes(optimized, args)
    lowest.save(tmp_path / "plan.json")
    loaded = autoremat.load_plan(tmp_path / "plan.json", loss, *args)
    assert (loaded.placement.scan_groups, loaded.saved, loaded.peak_bytes) == (
        lowest.placement.scan_groups, lowest.saved, lowest.peak_bytes)
    assert "scans nested in   groups of 3 iterations" in lowest.report()
    # With room to save every layer's activations, nesting only costs: not chosen.
    assert autoremat.plan(loss, *args, budget=1.0, nested_scans=True).placement.scan_groups == ()


def _step_forward_flops(loss, args) -> int:
    """FLOPs of the scan's matmuls in the forward pass."""
    ws, x = args
    return 2 * ws.shape[0] * 2 * x.shape[0] * x.shape[1] * ws.shape[-1]


def test_nested_scan_of_a_loop_without_scanned_inputs():
    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sum(jax.lax.scan(lambda h, _: (jnp.tanh(h @ w), None), x, None,
                                    length=9)[0] ** 2)

    args = (jax.random.normal(jax.random.key(0), (32, 32)) / 6,
            jax.random.normal(jax.random.key(1), (256, 32)))
    lowest = autoremat.plan(loss, *args, budget="floor", nested_scans=True)
    assert lowest.placement.scan_groups == (3,)
    optimized = lowest.apply(loss)
    at_the_floor = autoremat.optimize(loss, lowest.budget_bytes, nested_scans=True)
    for g0, g1, g2 in zip(_grads(loss, args), _grads(optimized, args),
                          jax.jit(lambda *a: _grads(at_the_floor, a))(*args), strict=True):
        _assert_close(g0, g1)
        _assert_close(g0, g2)
    assert lowest.saved_bytes == _actual_saved_bytes(optimized, args)


def test_nested_segments_lower_the_floor_and_apply_as_planned(tmp_path):
    # A 4-layer MLP in 6 regions: nested in groups of 2, a group keeps its input across
    # the step and the activations inside it only during its own backward.
    loss, args = MODELS["mlp"]()
    plain = autoremat.plan(loss, *args, budget="floor")
    lowest = autoremat.plan(loss, *args, budget="floor", nested_segments=True)
    assert lowest.placement.segment_group == 2 and lowest.peak_bytes < plain.peak_bytes
    nests = [r.nest for r in lowest.graph.regions]
    assert nests == [0, 0, 2, 2, 4, 4]
    # Every plan on it runs the groups' forward once more.
    assert lowest.recompute_flops >= sum(int(v.flops) for v in lowest.graph.values)
    optimized = lowest.apply(loss)
    for g0, g1 in zip(_grads(loss, args), _grads(optimized, args), strict=True):
        _assert_close(g0, g1)
    assert lowest.saved_bytes == _actual_saved_bytes(optimized, args)
    # One more checkpoint per group, around the segments' own.
    outer = [e for e in jax.make_jaxpr(optimized)(*args).jaxpr.eqns if "prevent_cse" in e.params]
    assert len(outer) == 3
    assert all(sum("prevent_cse" in i.params for i in e.params["jaxpr"].eqns) == 2
               for e in outer)
    lowest.save(tmp_path / "plan.json")
    loaded = autoremat.load_plan(tmp_path / "plan.json", loss, *args)
    assert (loaded.placement.segment_group, loaded.saved, loaded.peak_bytes) == (
        lowest.placement.segment_group, lowest.saved, lowest.peak_bytes)
    assert "segments nested   in groups of 2" in lowest.report()
