"""The memory model on traced graphs: the gradients' buffers are allocated for the whole
step (the second stage bound), a skip connection's cotangent is held across the layers it
skips (the model over a problem: tests/ilp/test_memory.py)."""

import dataclasses

import autoremat_ilp as ilp
import jax
import jax.numpy as jnp
import numpy as np

from autoremat import _rewrite, _solve, _trace
from autoremat._placement import Placement
from tests.ilp.examples import two_regions


def test_activations_larger_than_every_weight_cannot_share_the_gradients():
    w1, w2 = jnp.ones((16, 32)), jnp.ones((32, 16))
    x = jnp.ones((64, 16))
    loss = lambda w1, w2, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2))
    _, _, graph = _trace.trace(lambda *a: [loss(*a)], [jax.ShapeDtypeStruct(a.shape, a.dtype)
                                                       for a in (w1, w2, x)])
    assert graph.grad_buffers == (x.nbytes, w1.nbytes, w2.nbytes)
    problem = _solve.problem_of(graph)
    hidden = np.array([v.shape == (64, 32) for v in graph.values])
    larger, fits_x = problem.reserved_bounds()
    assert (larger.held[hidden] > 0).all() and not larger.held[~hidden].any()
    assert (larger.room == 0).all()
    # The values of x's size fit in x's gradient alone.
    assert ((fits_x.held > 0) == np.array([v.nbytes > w1.nbytes for v in graph.values])).all()
    assert (fits_x.room == x.nbytes).all()
    backward, forward = graph.reserved_base_bytes()
    assert (backward - graph.backward_base_bytes() >= 0).all()
    assert (forward - graph.forward_base_bytes() == graph.grad_bytes).all()


def test_a_regions_saved_values_share_only_the_gradients_written_at_its_backward_or_later():
    """The backward visits regions last to first: the second layer's weight gradient is
    written before the first region's saved values die, so they cannot share it."""
    w1, w2, x = jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.ones((8, 16))
    loss = lambda w1, w2, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w1, w2, x)]
    program = _trace.trace_program(lambda *a: [loss(*a)], avals)
    dots = [i for i, e in enumerate(program.eqns) if e.primitive.name == "dot_general"]
    _, graph = _trace.graph_of(program, Placement((dots[1],)))
    assert len(graph.regions) == 2
    written = dict(zip(graph.grad_buffers, graph.grad_written, strict=True))
    assert written[w1.nbytes] == 0 and written[w2.nbytes] == 1
    # Values larger than x's gradient fit in w1's and w2's: at region 0's stages only in
    # w1's, at region 1's in both.
    held = x.nbytes + 1
    masks, caps, room, fits = graph.reserved_room(np.full(len(graph.values), held))
    assert masks[-2:].all() and caps[-1] == held and fits[-1] == max(w1.nbytes, w2.nbytes)
    assert room[-2].tolist() == [w1.nbytes, w1.nbytes + w2.nbytes]
    # A buffer holds one value at a time: of each, the value's bytes at most.
    assert room[-1].tolist() == [held, 2 * held]


def _skip_net(w, x):
    """A long skip connection: ``x`` is concatenated to the result of three layers."""
    x = jnp.tanh(x @ w)
    h = x
    for _ in range(3):
        h = jnp.tanh(h @ w)
    return jnp.sum(jnp.concatenate([h, x], axis=-1) @ jnp.ones((64, 8)))


def test_a_skip_cotangent_holds_the_concatenation_across_the_layers_it_skips():
    w, x = jnp.ones((32, 32)), jnp.ones((256, 32))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    program = _trace.trace_program(lambda *a: [_skip_net(*a)], avals)
    names = [e.primitive.name for e in program.eqns]
    dots = [i for i, n in enumerate(names) if n == "dot_general"]
    concat = 2 * x.nbytes  # the concatenation's bytes, not the skip's
    # Whole: the skip's cotangent lives from the last dot's transpose to the first's.
    (whole,) = _trace.graph_of(program, Placement())[1].regions
    assert whole.cotangent_bytes >= concat
    # One region per layer: the middle ones neither make nor read the skip.
    regions = _trace.graph_of(program, Placement(tuple(dots[2:4])))[1].regions
    assert len(regions) == 3 and regions[1].cotangent_bytes >= concat
    holders = _trace._cotangent_holders(program.eqns, program.value_bytes)
    assert max(holders.values()) == concat


def _residual_relu_net(ws, x):
    """Residual blocks ``x + relu(x @ w1) @ w2`` then a ReLU, as a ResNet's."""
    for w1, w2 in ws:
        x = jax.nn.relu(x + jax.nn.relu(x @ w1) @ w2)
    return jnp.sum(x.astype(jnp.float32) ** 2)


def _residual_relu_graph(placement=None):
    ws = [(jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
           jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16)) for _ in range(6)]
    x = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    flat_fn, _, avals, _ = _rewrite.flat_function(_residual_relu_net, (ws, x), {})
    return _trace.trace(flat_fn, avals, placement, layout="tpu")


def test_a_call_of_elementwise_ops_fuses_as_they_do():
    """``jax.nn.relu`` is a ``custom_jvp_call`` of a ``jit`` of ``max``: XLA inlines and
    fuses it, so that recomputed it takes no memory of its own; a dot's output does."""
    _, _, graph = _residual_relu_graph()
    by_primitive = {v.primitive: v.fused for v in graph.values}
    assert by_primitive["custom_jvp_call"] and not by_primitive["dot_general"]
    problem = _solve.problem_of(graph)
    relu = graph.array("primitive", object) == "custom_jvp_call"
    assert not problem.transient[relu].any()


def test_a_block_output_is_released_at_the_next_blocks_backward():
    """A block's output, which nothing in its block reads, is freed once the next block's
    backward has run; a value its own backward reads stays to the end of it."""
    program, _, _ = _residual_relu_graph()
    blocks = [k for k, e in enumerate(program.eqns) if e.primitive.name == "dot_general"][2::2]
    _, _, graph = _residual_relu_graph(Placement(tuple(blocks)))
    handed = [v for v in graph.values if v.released != v.region]
    assert len(handed) >= len(blocks) - 1
    assert all(v.released == v.region + 1 and not v.needed for v in handed)
    assert all(v.released == v.region for v in graph.values if v.needed)


def _gelu_mlp(ws, x):
    """Dense layers with the tanh GELU, whose backward reads several elementwise values."""
    for w in ws:
        x = jax.nn.gelu(x @ w)
    return jnp.mean(x.astype(jnp.float32) ** 2)


def _gelu_mlp_args(width=256, depth=4, batch=512):
    ws = [jax.ShapeDtypeStruct((width, width), jnp.bfloat16) for _ in range(depth)]
    return ws, jax.ShapeDtypeStruct((batch, width), jnp.bfloat16)


def _graph(fn, args, placement=None):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    return _trace.trace(flat_fn, avals, placement)[2]


def test_as_written_elementwise_residuals_fuse_back_to_the_dots():
    graph = _graph(_gelu_mlp, _gelu_mlp_args())
    problem = _solve.problem_of(graph)
    through, starts, _ = _solve._fused_chains(graph, problem)
    kept = problem.must_cover & problem.can_save
    primitive = graph.array("primitive", object)
    assert (kept & through).sum() > (primitive == "dot_general").sum()  # several per layer
    for k in np.flatnonzero(kept & through):
        assert {primitive[j] for j in starts[k]} == {"dot_general"}
    nothing, written = _solve.no_remat(graph, problem), _solve.as_written(graph, problem)
    # The same values saved (what JAX keeps), a lower peak: one dot result per layer
    # where JAX saves its GELU's several values.
    assert (written.saved, written.recomputed) == (nothing.saved, nothing.recomputed)
    assert written.peak_bytes < nothing.peak_bytes


def _prenorm_residual_net(ws, x):
    """Pre-norm residual blocks ``x + relu(norm(x) @ w1) @ w2``, as a transformer's."""
    for w1, w2 in ws:
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        x = x + jax.nn.relu(h @ w1) @ w2
    return jnp.sum(x.astype(jnp.float32) ** 2)


def test_as_written_a_chain_stops_at_its_regions_inputs():
    """A region run as written keeps what another region reads: its elementwise chains
    start there, not at the dots of earlier regions (a residual stream's adds chain back
    through every block: llama-unrolled's head, as written, was modelled saving two dots
    of every block)."""
    ws = [(jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
           jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16)) for _ in range(4)]
    args = (ws, jax.ShapeDtypeStruct((512, 256), jnp.bfloat16))
    flat_fn, _, avals, _ = _rewrite.flat_function(_prenorm_residual_net, args, {})
    program = _trace.trace(flat_fn, avals)[0]
    adds = [k + 1 for k, e in enumerate(program.eqns) if e.primitive.name == "add"
            and program.avals[e.outs[0]].shape == (512, 256)]
    graph = _trace.trace(flat_fn, avals, Placement(tuple(adds[:-1]), barriers=False))[2]
    through, starts, chain = _solve._fused_chains(graph, _solve.problem_of(graph))
    region = graph.array("region")
    assert len(graph.regions) == len(ws)
    crossing = [k for k in np.flatnonzero(through) if (region[list(starts[k])] < region[k]).any()]
    assert crossing  # chains that start at an earlier block's output
    for k in np.flatnonzero(through):
        assert set(region[list(chain[k])]) == {region[k]}


def _scanned_gelu_mlp(unroll):
    def loss(ws, x):
        x, _ = jax.lax.scan(lambda h, w: (jax.nn.gelu(h @ w), None), x, ws, unroll=unroll)
        return jnp.mean(x.astype(jnp.float32) ** 2)

    return loss


def test_as_written_a_scan_unrolled_whole_fuses_as_straight_line_code():
    """JAX lowers a scan unrolled whole (penzai's ``LayerStack``) to straight-line code,
    whose GELUs XLA fuses into the backward as in a segment; a rolled loop keeps what JAX
    saves per iteration."""
    ws, x = _gelu_mlp_args(depth=6, batch=4096)
    args = (jax.ShapeDtypeStruct((len(ws), *ws[0].shape), ws[0].dtype), x)
    peaks = []
    for unroll in (1, True):
        graph = _graph(_scanned_gelu_mlp(unroll), args)
        problem = _solve.problem_of(graph)
        through, _, _ = _solve._fused_chains(graph, problem)
        in_scan = np.array([graph.regions[v.region].kind == "scan" for v in graph.values])
        assert (through & in_scan).any() == (unroll is True)
        peaks.append(_solve.as_written(graph, problem).peak_bytes)
    assert peaks[1] < peaks[0]


def _conv_net(ws, x):
    for w in ws:
        x = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME"))
    return jnp.mean(x ** 2)


def test_as_written_keeps_what_a_convolution_reads():
    ws = [jax.ShapeDtypeStruct((8, 8, 3, 3), jnp.float32) for _ in range(3)]
    graph = _graph(_conv_net, (ws, jax.ShapeDtypeStruct((2, 8, 16, 16), jnp.float32)))
    through, _, _ = _solve._fused_chains(graph, _solve.problem_of(graph))
    conv_inputs = {u for v in graph.values if v.primitive == "conv_general_dilated"
                   for u in v.inputs}
    assert conv_inputs and not any(through[k] for k, v in enumerate(graph.values)
                                   if v.id in conv_inputs)


def test_unshared_counts_every_saved_value_beside_all_the_reserved_buffers():
    problem = dataclasses.replace(two_regions(np.array([[True, True]])),
                                  reserved_room=np.array([20]))
    save = np.array([True, True])
    # With the room: 70 + 100 - 20 and 70 + 110 - 20; unshared, none of it.
    assert ilp.stage_bytes(problem, save, ~save).tolist()[:2] == [150, 160]
    assert ilp.stage_bytes(_solve.unshared(problem), save, ~save).tolist()[:2] == [170, 180]
    plain = two_regions(None)
    assert _solve.unshared(plain) is plain


def _group_norm_convs(ws, x):
    """Channels-first convolutions with Equinox's group norm: the channels split."""
    for w in ws:
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME").astype(jnp.float32)
        g = y.reshape(y.shape[0], 4, -1, *y.shape[2:])
        g = (g - g.mean((2, 3, 4), keepdims=True)) * jax.lax.rsqrt(
            g.var((2, 3, 4), keepdims=True) + 1e-5)
        x = jax.nn.relu(g.reshape(y.shape)).astype(x.dtype)
    return jnp.mean(x.astype(jnp.float32) ** 2)


def test_as_written_keeps_the_copy_to_a_new_layout():
    """The reshape that splits a convolution output's channels is a copy the compiler
    keeps for the backward pass (an Equinox CNN's group norms, TPU v5e), not a value its
    chain recomputes from the convolution."""
    ws = [jax.ShapeDtypeStruct((16, 16, 3, 3), jnp.bfloat16) for _ in range(3)]
    graph = _graph(_group_norm_convs, (ws, jax.ShapeDtypeStruct((2, 16, 8, 8), jnp.bfloat16)))
    problem = _solve.problem_of(graph)
    save, _ = _solve.as_written_masks(graph, problem)
    relayout = graph.array("relayout", bool)
    assert relayout.sum() == len(ws)
    assert save[relayout].all()
    assert {graph.values[k].dtype for k in np.flatnonzero(relayout)} == {"float32"}
