"""The corpus of third-party models (``bench/corpus``): every tiny model runs, its hand
baseline (the library's remat of every block under ``nothing_saveable``) keeps the
gradients and really checkpoints, and its shape trees match what ``init`` makes."""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from autoremat.zoo import ZooModel
from bench import corpus

TINY = [n for n in corpus.CORPUS if n.endswith("-tiny")]
FULL = [n for n in corpus.CORPUS if not n.endswith("-tiny")]
HAND = jax.checkpoint_policies.nothing_saveable

# Compiling dominates these tests' time; LLVM's optimizations do not change the results.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


class _Tiny(NamedTuple):
    model: ZooModel
    params: Any
    batch: Any
    loss: jax.Array  # without checkpoints
    grads: Any
    hand_loss: jax.Array  # every block under nothing_saveable
    hand_grads: Any


@functools.cache
def _tiny(name: str) -> _Tiny:
    model = corpus.get(name)
    params, batch = model.init(jax.random.key(0))
    fns = [jax.value_and_grad(model.make_loss()), jax.value_and_grad(model.make_loss(HAND))]
    [(loss, grads), (hand_loss, hand_grads)] = jax.jit(
        lambda p, b: [fn(p, b) for fn in fns], compiler_options=_FAST_COMPILE)(params, batch)
    return _Tiny(model, params, batch, loss, grads, hand_loss, hand_grads)


def _residual_bytes(fn: Any, args: tuple) -> int:
    """Bytes JAX saves for the backward pass, arguments and constants excluded."""
    return sum(math.prod(aval.shape) * aval.dtype.itemsize
               for aval, source in saved_residuals(fn, *args)
               if not source.startswith("from the argument") and source != "from a constant")


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def test_registry():
    assert not corpus.MISSING, f"install the corpus libraries: pip install -e '.[corpus]' " \
                               f"({corpus.MISSING})"
    assert {n.removesuffix("-tiny") for n in TINY} == set(FULL)
    assert all(model.name == name and model.names == () for name, model in corpus.CORPUS.items())
    assert all("\n" not in m.description and "params" in m.description
               for m in corpus.CORPUS.values())
    with pytest.raises(KeyError, match="known: .*linen-cnn-tiny"):
        corpus.get("linen-cnn-tinyy")


@pytest.mark.parametrize("name", TINY)
def test_shapes_match_init(name):
    tiny = _tiny(name)
    for made, shapes in ((tiny.params, tiny.model.param_shapes()),
                         (tiny.batch, tiny.model.batch_shapes())):
        assert jax.tree.structure(made) == jax.tree.structure(shapes)
        assert all(isinstance(s, jax.ShapeDtypeStruct) for s in jax.tree.leaves(shapes))
        assert jax.tree.leaves(_abstract(made)) == jax.tree.leaves(_abstract(shapes))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(tiny.params))


@pytest.mark.parametrize("name", TINY)
def test_hand_baseline_keeps_loss_and_gradients(name):
    tiny = _tiny(name)
    assert np.isfinite(tiny.loss) and tiny.loss.shape == ()
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(tiny.grads))
    np.testing.assert_allclose(tiny.hand_loss, tiny.loss, rtol=1e-6)
    # Checkpointed blocks compile differently and reassociate float32 sums. Tolerance
    # relative to the largest gradient of the model: some gradients are zero in exact
    # arithmetic (attention key biases, which softmax ignores) and rounding noise otherwise.
    scale = max(float(np.max(np.abs(g), initial=0.0)) for g in jax.tree.leaves(tiny.grads))
    for g, h in zip(jax.tree.leaves(tiny.grads), jax.tree.leaves(tiny.hand_grads), strict=True):
        np.testing.assert_allclose(h, g, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("name", TINY)
def test_hand_baseline_checkpoints(name):
    """The library's remat is really applied: fewer residuals saved than without it."""
    model = corpus.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    assert 0 < _residual_bytes(model.make_loss(HAND), args) < _residual_bytes(model.make_loss(),
                                                                              args)


def test_keras_own_remat_saves_what_nothing_saveable_saves():
    """keras.remat (jax.checkpoint without a policy) and the hook with nothing_saveable."""
    from bench.corpus import _keras, keras_transformer

    args = (keras_transformer.param_shapes(keras_transformer.TINY),
            keras_transformer.batch_shapes(keras_transformer.TINY))
    own = keras_transformer.make_loss(keras_transformer.TINY, _keras.KERAS_REMAT)
    hand = keras_transformer.make_loss(keras_transformer.TINY, HAND)
    assert _residual_bytes(own, args) == _residual_bytes(hand, args) < _residual_bytes(
        keras_transformer.make_loss(keras_transformer.TINY), args)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_full_size_activations_dominate(name):
    """Traced from shapes only: a float32 scalar loss, and saved activations without remat
    several times the parameters, far more than the hand baseline's."""
    model = corpus.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    out = jax.eval_shape(model.make_loss(), *args)
    assert (out.shape, out.dtype) == ((), jnp.float32)
    param_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(args[0]))
    none, hand = _residual_bytes(model.make_loss(), args), _residual_bytes(model.make_loss(HAND),
                                                                           args)
    assert none > 3 * param_bytes and none > 3 * hand
