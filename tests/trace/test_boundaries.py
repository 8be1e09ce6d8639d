"""Candidate region boundaries from the program's structure (``_trace._boundaries``)."""

from __future__ import annotations

import collections
import itertools

import autoremat_ilp as ilp
import equinox as eqx
import flax.linen as nn
import jax
import jax.extend as jax_extend
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _rewrite, _solve, _trace
from autoremat._placement import Placement
from autoremat._planner import PlanOptions
from autoremat._planner._candidates import candidates, obvious_plans
from tests.models import saved_residuals


class _Block(nn.Module):
    channels: int
    stride: int

    @nn.compact
    def __call__(self, x):
        y = nn.relu(nn.Conv(self.channels, (3, 3), strides=self.stride)(x))
        y = nn.Conv(self.channels, (3, 3))(y)
        if x.shape != y.shape:
            x = nn.Conv(self.channels, (1, 1), strides=self.stride)(x)
        return nn.relu(x + y)


class _ShrinkingCNN(nn.Module):
    """Residual blocks, stages shrinking 16x16x8 -> 2x2x64, a 10-class head: the narrowest
    crossing is late, so no layer boundary is within 1.5x of it."""

    remat: bool = False

    @nn.compact
    def __call__(self, x):
        block = nn.remat(_Block, policy=jax.checkpoint_policies.nothing_saveable) \
            if self.remat else _Block
        x = nn.Conv(8, (3, 3))(x)
        for stage, channels in enumerate((8, 16, 32, 64)):
            for i in range(2):
                x = block(channels, 2 if stage and not i else 1, name=f"block{2 * stage + i}")(x)
        return nn.Dense(10)(x.mean((1, 2)))


_BLOCKS = 8


def _cnn(remat: bool = False):
    model = _ShrinkingCNN(remat)
    x = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
    params = model.init(jax.random.key(1), x)
    return (lambda p, x: jnp.mean(model.apply(p, x) ** 2)), (params, x)


class _NarrowHeadMLP(eqx.Module):
    layers: list
    head: eqx.nn.Linear

    def __init__(self, key):
        keys = jax.random.split(key, 7)
        self.layers = [eqx.nn.Linear(64, 64, key=k) for k in keys[:6]]
        self.head = eqx.nn.Linear(64, 2, key=keys[6])

    def __call__(self, x):
        for layer in self.layers:
            x = jax.nn.gelu(layer(x))
        return self.head(x)


def _mlp():
    params, static = eqx.partition(_NarrowHeadMLP(jax.random.key(0)), eqx.is_array)
    x = jax.random.normal(jax.random.key(1), (128, 64))
    return (lambda p, x: jnp.mean(jax.vmap(eqx.combine(p, static))(x) ** 2)), (params, x)


def _program(loss, args):
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    return _trace.trace_program(flat_fn, avals)


def test_every_block_of_a_shrinking_cnn_is_a_layer_boundary():
    program = _program(*_cnn())
    assert _trace.segment_cuts(program) == ()  # the narrow head hides every block
    cuts = _trace.layer_cuts(program)
    regions = autoremat._program.split_regions(program, Placement(cuts))
    # Each region holds the convolutions of one block (named block<k>), and each
    # block's convolutions are in one region.
    blocks = [{s.split("/")[1] for e in r.eqns if e.primitive.name == "conv_general_dilated"
               and (s := str(e.source_info.name_stack)).count("/") == 2} for r in regions]
    assert [b for b in blocks if b] == [{f"block{k}"} for k in range(_BLOCKS)]
    # Only the residual stream crosses each cut: one activation, the output of a block's
    # last add (smaller than its input when the block shrinks it).
    crossing = _trace.crossing_bytes(program)
    for p in cuts:
        assert crossing[p] in {program.value_bytes(o) for e in program.eqns[:p] for o in e.outs}


def test_layers_of_an_equinox_mlp_with_a_narrow_head():
    program = _program(*_mlp())
    regions = autoremat._program.split_regions(program, Placement(_trace.layer_cuts(program)))
    dots = [sum(e.primitive.name == "dot_general" for e in r.eqns) for r in regions]
    assert dots == [1] * 7  # six layers, whose code Equinox hides from tracebacks, and the head


def test_nothing_repeats_no_layers():
    def loss(w, x):
        return jnp.sum(jnp.sin(jnp.tanh(x @ w)) ** 2)

    assert _trace.layer_cuts(_program(loss, (jnp.ones((8, 8)), jnp.ones((4, 8))))) == ()


@pytest.mark.parametrize("make", [_cnn, _mlp], ids=["linen-cnn", "equinox-mlp"])
def test_the_floor_is_at_or_below_no_remat_and_one_remat_per_layer(make):
    loss, args = make()
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    found = candidates(flat_fn, avals, PlanOptions())
    no_remat, *per_layer = obvious_plans(found, PlanOptions())
    floor = autoremat.plan(loss, *args, budget="floor")
    for p in per_layer:
        assert floor.peak_bytes <= p.peak_bytes <= no_remat.peak_bytes
        assert p.placement.cuts == _trace.layer_cuts(found[0].facts.program)
    assert floor.peak_bytes < no_remat.peak_bytes
    assert [bool(p.placement.written) for p in per_layer] == [False, True]


def test_one_remat_per_layer_is_what_the_library_remat_saves():
    """The per-layer plan keeps what ``nn.remat(Block, policy=nothing_saveable)`` keeps: the
    plan is the hand baseline, so the floor below it is below the user's own line."""
    loss, args = _cnn()
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    found = candidates(flat_fn, avals, PlanOptions())
    *_, per_layer = obvious_plans(found, PlanOptions())
    graph = per_layer.graph
    assert graph is not None
    problem = _solve.problem_of(graph)
    ids = graph.array("id")
    save = np.isin(ids, list(per_layer.saved))
    recompute = np.isin(ids, list(per_layer.recomputed))
    assert ilp.violations(problem, save, recompute) == []

    def kept(fn, *a):
        return collections.Counter((r.shape, r.dtype.name) for r, src in saved_residuals(fn, *a)
                                   if not src.startswith("from the argument"))

    hand_loss, _ = _cnn(remat=True)
    planned = kept(per_layer.apply(loss), *args)
    assert sum(np.prod(s) * 4 for (s, _), n in planned.items() for _ in range(n)) \
        == per_layer.saved_bytes
    # The same residuals as Flax's remat per block: every block's input, and what the stem
    # and the head keep.
    assert planned == kept(hand_loss, *args)
    g, g_hand = jax.grad(per_layer.apply(loss))(*args), jax.grad(hand_loss)(*args)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_hand), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_zoo_resnet_gets_a_boundary_per_bottleneck_block():
    m = autoremat.zoo.get("resnet")  # 16 bottleneck blocks, traced from shapes
    program = _program(m.make_loss(), (m.param_shapes(), m.batch_shapes()))
    assert len(_trace.segment_cuts(program)) <= 1  # the late narrow crossing hides them
    assert len(_trace.layer_cuts(program)) == 16 + 1  # each block, and the head


def test_the_last_layer_ends_where_its_code_does():
    """Flax hides its layers' source lines, and a block's last equations (a projection, its
    bias, the residual add) recur in it after the attention too: the last layer still ends
    after its MLP's residual add, as every other layer does."""
    from bench import corpus

    m = corpus.get("linen-encoder-tiny")
    program = _program(m.make_loss(), m.init(jax.random.key(0)))
    regions = autoremat._program.split_regions(program, Placement(_trace.layer_cuts(program)))
    dots = [sum(e.primitive.name == "dot_general" for e in r.eqns) for r in regions]
    assert dots == [0, 8, 8, 1]  # the embeddings, two blocks, the head
    assert _trace.layer_regions(program) == {1, 2}


@pytest.mark.parametrize(("name", "scans"), [("linen-encoder-scan-tiny", 1),
                                             ("nnx-transformer-scan-tiny", 1)])
def test_the_layers_of_a_scanned_model_are_its_scan(name, scans):
    from bench import corpus

    m = corpus.get(name)
    program = _program(m.make_loss(), m.init(jax.random.key(0)))
    regions = autoremat._program.split_regions(program, Placement(_trace.layer_cuts(program)))
    layers = _trace.layer_regions(program)
    assert [regions[k].kind for k in sorted(layers)] == ["scan"] * scans
    assert len(regions) > len(layers)  # the code around the loop stays as written


def test_each_double_convolution_of_the_zoo_unet_is_a_layer():
    """The U-Net's block runs convolution, group norm and SiLU twice, and is called from
    the encoder's loop, the middle and the decoder's loop: one layer per call, not per
    round, nor one per line of the loss that calls it."""
    m = autoremat.zoo.get("unet-tiny")
    program = _program(m.make_loss(), (m.param_shapes(), m.batch_shapes()))
    regions = autoremat._program.split_regions(program, Placement(_trace.layer_cuts(program)))
    convs = [sum(e.primitive.name == "conv_general_dilated" for e in r.eqns) for r in regions]
    assert convs == [2, 2, 2, 2, 2, 1]  # 2 levels down, the middle, 2 up, the head
    assert _trace.layer_regions(program) == {0, 1, 2, 3, 4}


def _penzai_llama(n_layer: int, layer_policy=None):
    """penzai's Llama-like model, the corpus's tiny shapes with ``n_layer`` blocks."""
    import dataclasses

    from bench.corpus import penzai_llama

    c = dataclasses.replace(penzai_llama.TINY, n_layer=n_layer)
    return penzai_llama.make_loss(c, layer_policy), penzai_llama.init(c, jax.random.key(0))


def test_the_layers_of_penzai_llama_start_where_its_blocks_do():
    """No token of the RMSNorm that starts each penzai block recurs once per layer (it runs
    before the MLP and after the last block too), so the layers found first started inside
    the attention, where two activations cross; shifted, each cut is where the fewest
    bytes of its layer cross, and each layer after the first takes the activations that
    penzai's own ``Checkpointed`` block does."""
    loss, args = _penzai_llama(4)
    program = _program(loss, args)
    cuts = _trace.layer_cuts(program)
    crossing = _trace.crossing_bytes(program)
    for a, b in itertools.pairwise(cuts[1:-1]):  # the layers after the first but the last
        assert crossing[a] == crossing[a:b].min()

    hand_loss, _ = _penzai_llama(4, jax.checkpoint_policies.nothing_saveable)
    layers, blocks = _activations_read(program, hand_loss, args, rank=3)
    assert layers[2:-1] == blocks[1:] == [[(2, 8, 16)]] * 3


def _activations_read(program, hand_loss, args, rank):
    """The activations (arrays of rank ``rank`` not shaped as a weight) that each region
    at the layer cuts of ``program`` reads, and that each ``jax.checkpoint`` (one per
    block) of ``hand_loss`` reads."""
    weights = {x.shape for x in jax.tree.leaves(args[0])}

    def activations(shapes):
        return sorted(s for s in shapes if len(s) == rank and s not in weights)

    regions = autoremat._program.split_regions(program, Placement(_trace.layer_cuts(program)))
    layers = [activations(program.avals[i].shape for i in r.inputs if i not in program.args)
              for r in regions]
    blocks = [activations(v.aval.shape for v in e.invars)
              for e in _eqns(jax.make_jaxpr(hand_loss)(*args).jaxpr)
              if e.primitive.name == "remat2"]  # jax.checkpoint
    return layers, blocks


def _eqns(jaxpr):
    """The equations of ``jaxpr``, those inside the ones that call a jaxpr but a
    checkpoint's."""
    for e in jaxpr.eqns:
        yield e
        if e.primitive.name != "remat2":
            for sub in jax_extend.core.jaxprs_in_params(e.params):
                yield from _eqns(sub)


def test_one_remat_per_layer_passes_no_input_barrier():
    """As ``jax.checkpoint`` per block writes it: with the barriers autoremat's own segments
    pass their inputs through, a Flax NNX transformer's per-layer plan compiled for TPU v5e
    0.25% above ``nnx.remat`` per block, and the same without. Its policy file keeps it."""
    loss, args = _penzai_llama(3)
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    found = candidates(flat_fn, avals, PlanOptions())
    _, rematted, written = obvious_plans(found, PlanOptions())
    for p in (rematted, written):
        assert not p.placement.barriers
        regions = autoremat._program.split_regions(found[0].facts.program, p.placement)
        assert not any(autoremat._program.has_input_barrier(r) for r in regions)
        text = jax.make_jaxpr(p.apply(loss))(*args)
        assert "optimization_barrier" not in str(text)
        assert Placement.from_json(p.placement.to_json()) == p.placement


def test_the_layers_of_haiku_resnet_are_its_blocks():
    """Haiku's bottleneck block computes its projection shortcut before the convolutions
    every block runs, and ends with a residual add and a ReLU: each layer found takes the
    activations that ``hk.remat`` per block does, the first block's projection in it, and
    no cut falls between a block's last batch norm and its residual add."""
    from bench import corpus

    m = corpus.get("haiku-resnet-tiny")
    loss, args = m.make_loss(), m.init(jax.random.key(0))
    program = _program(loss, args)
    cuts = _trace.layer_cuts(program)
    assert program.eqns[cuts[0]].primitive.name == "conv_general_dilated"  # the projection
    hand = m.make_loss(jax.checkpoint_policies.nothing_saveable)
    layers, blocks = _activations_read(program, hand, args, rank=4)
    assert layers[1:-1] == blocks and len(blocks) == 4


def test_the_first_layer_takes_in_the_code_other_layers_run_before_theirs():
    """A projection shortcut (``p q``) runs at the head of the first layer of a stage, before
    the code every layer runs (``a b``): the first layer starts at it, where it found its
    start at ``a`` beside the projection's output."""
    from autoremat._trace._boundaries import _with_lead

    tokens = [(c, ()) for c in "xpqabrabrpqab"]
    crossing = np.array([0, 1, 3, 3, 3, 2, 2, 2, 2, 2, 3, 3, 3, 1])
    assert _with_lead(tokens, crossing, [3, 5, 8]) == [1, 5, 8]
    crossing[1] = 4  # where more bytes would cross, the start stays
    assert _with_lead(tokens, crossing, [3, 5, 8]) == [3, 5, 8]
