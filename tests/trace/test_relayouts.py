"""Which reshapes the TPU compiler runs as copies: a convolution output's feature
dimension split or merged."""

import jax
import jax.numpy as jnp

from autoremat import _rewrite, _trace
from autoremat._trace._relayouts import relayouts

_W = jax.ShapeDtypeStruct((16, 16, 3, 3), jnp.float32)


def _relayout_shapes(fn, *args):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    program = _trace.trace(flat_fn, avals)[0]
    return sorted(tuple(program.avals[v].shape) for v in relayouts(program))


def _conv(x, w, layout):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=(layout, "OIHW", layout))


def _group_norm_nchw(w, x):
    """Equinox's group norm of a channels-first convolution: the channels split."""
    y = jax.nn.relu(_conv(x, w, "NCHW")).astype(jnp.float32)
    g = y.reshape(y.shape[0], 4, 4, *y.shape[2:])
    g = (g - g.mean((2, 3, 4), keepdims=True)) * jax.lax.rsqrt(
        g.var((2, 3, 4), keepdims=True) + 1e-5)
    return jnp.sum(g.reshape(y.shape) ** 2)


def _flattened_nhwc(w, x):
    """Space merged, channels kept (attention over a feature map): no copy."""
    y = _conv(x, w, "NHWC")
    t = y.reshape(y.shape[0], -1, y.shape[-1])
    return jnp.sum(jnp.tanh(t) ** 2)


def _split_without_convolution(x):
    return jnp.sum(jnp.tanh(x).reshape(2, 4, 4, 8, 8) ** 2)


def test_a_split_of_a_convolutions_channels_is_a_copy():
    x = jax.ShapeDtypeStruct((2, 16, 8, 8), jnp.float32)
    assert _relayout_shapes(_group_norm_nchw, _W, x) == [(2, 4, 4, 8, 8)]


def test_a_merge_that_keeps_the_channels_is_no_copy():
    x = jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.float32)
    assert _relayout_shapes(_flattened_nhwc, _W, x) == []


def test_a_reshape_of_no_convolutions_output_is_no_copy():
    assert _relayout_shapes(_split_without_convolution,
                            jax.ShapeDtypeStruct((2, 16, 8, 8), jnp.float32)) == []
