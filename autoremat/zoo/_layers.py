"""Building blocks shared by the zoo's models: pure functions on arrays.

Numerics: normalization statistics (LayerNorm, RMSNorm, batch and group norm) are
computed in float32 and the result cast back to the activation dtype; RoPE rotates in
float32. Everything else runs in the activation dtype (bfloat16 for the full-size
models), including the attention softmax and the loss's log-softmax (``jax.nn``'s, which
accumulate their sums in float32); the loss is averaged in float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

Block = Callable[[Any, jax.Array], jax.Array]


def init_params(shapes: Any, key: jax.Array, std: float = 0.02) -> Any:
    """Random arrays for a pytree of ``jax.ShapeDtypeStruct`` leaves, by leaf name.

    Names ending in ``_g`` (norm gains) get ones, names starting ``b_`` or ending ``_b``
    (biases) zeros, and everything else normal values with standard deviation ``std``,
    cut from a single draw (one random kernel whatever the number of leaves).
    """
    leaves, tree = jax.tree.flatten_with_path(shapes)
    sizes = [math.prod(s.shape) for _, s in leaves]
    draws = np.split(np.asarray(std * jax.random.normal(key, (sum(sizes),))),
                     np.cumsum(sizes)[:-1])

    def init(path: Any, s: jax.ShapeDtypeStruct, draw: np.ndarray) -> jax.Array:
        name = str(path[-1].key)
        if name.endswith("_g"):
            draw = np.ones_like(draw)
        elif name.startswith("b_") or name.endswith("_b"):
            draw = np.zeros_like(draw)
        return jnp.asarray(draw.reshape(s.shape), s.dtype)

    return jax.tree.unflatten(tree, [init(p, s, d)
                                     for (p, s), d in zip(leaves, draws, strict=True)])


def as_shapes(shapes: Any, dtype: Any) -> Any:
    """A pytree whose leaves are shape tuples, as ``jax.ShapeDtypeStruct`` leaves of ``dtype``."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dtype), shapes,
                        is_leaf=lambda x: isinstance(x, tuple))


def stacked(layer: dict[str, tuple[int, ...]], n: int, scan: bool) -> Any:
    """Shapes of ``n`` identical layers: one dict of ``(n, ...)`` shapes for ``lax.scan``
    when ``scan``, else a list of ``n`` dicts."""
    if scan:
        return {k: (n, *s) for k, s in layer.items()}
    return [dict(layer) for _ in range(n)]


def _normalize(x: jax.Array, axes: Sequence[int], eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axes, keepdims=True)
    var = jnp.square(x32 - mean).mean(axes, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)


def layer_norm(x: jax.Array, g: jax.Array, b: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last axis."""
    return _normalize(x, (-1,), eps) * g + b


def batch_norm(x: jax.Array, g: jax.Array, b: jax.Array, eps: float = 1e-5) -> jax.Array:
    """Training-mode batch norm of NHWC ``x`` over batch and space (no running statistics)."""
    return _normalize(x, (0, 1, 2), eps) * g + b


def group_norm(x: jax.Array, g: jax.Array, b: jax.Array, groups: int, eps: float = 1e-5
               ) -> jax.Array:
    """Group norm of NHWC ``x``: channels in ``groups`` groups, each over space and group."""
    n, h, w, c = x.shape
    y = _normalize(x.reshape(n, h, w, groups, c // groups), (1, 2, 4), eps)
    return y.reshape(x.shape) * g + b


def rms_norm(x: jax.Array, g: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis."""
    x32 = x.astype(jnp.float32)
    ms = jnp.square(x32).mean(-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(ms + eps)).astype(x.dtype) * g


def rope(x: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding of ``x`` (batch, seq, heads, head_dim), positions 0..seq-1,
    rotating the two halves of the head dimension."""
    seq, dim = x.shape[1], x.shape[3]
    freq = base ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) / (dim // 2))
    angle = jnp.arange(seq, dtype=jnp.float32)[:, None] * freq  # (seq, dim/2)
    cos, sin = jnp.cos(angle)[:, None], jnp.sin(angle)[:, None]  # (seq, 1, dim/2)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def split_qkv(qkv: jax.Array, n_head: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A fused projection (batch, seq, 3 * d) as queries, keys and values, each
    (batch, seq, n_head, d // n_head)."""
    b, t, d3 = qkv.shape
    parts = jnp.split(qkv.reshape(b, t, 3, n_head, d3 // (3 * n_head)), 3, axis=2)
    q, k, v = (x[:, :, 0] for x in parts)
    return q, k, v


def attention(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    """Softmax attention with grouped query heads, named ``"context"``.

    The layout is Flax's ``dot_product_attention``'s (sequence before heads), with
    einsums whose output is already in the layout of the next projection's input. (Measured
    on the TPU v5e compiler with head-major activations, where a transpose follows the
    value matmul: under ``everything_saveable`` or an autoremat plan XLA computed that
    matmul a second time, about 2% of a GPT-2-small step, while the step without
    checkpoints did not. In this layout every program, with or without checkpoints, has
    the same matmul count.)

    Args:
      q: queries (batch, seq, heads, head_dim).
      k, v: keys and values (batch, kv_seq, kv_heads, head_dim); ``heads`` is a multiple
        of ``kv_heads``, and each key/value head serves ``heads // kv_heads`` consecutive
        query heads (one when they are equal: multi-head attention).
      causal: mask each query from later positions (needs ``seq == kv_seq``).

    Returns:
      The attention output, (batch, seq, heads * head_dim).
    """
    b, t, h, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    if h == kv:
        scores_spec, out_spec = "bthd,bshd->bhts", "bhts,bshd->bthd"
    else:  # each kv head's query heads on an axis of their own
        q = q.reshape(b, t, kv, h // kv, d)
        scores_spec, out_spec = "btkgd,bskd->bkgts", "bkgts,bskd->btkgd"
    scores = jnp.einsum(scores_spec, q, k) / jnp.sqrt(jnp.asarray(d, q.dtype))
    if causal:
        scores = scores + jnp.where(jnp.tril(jnp.ones((t, s), bool)), 0.0,
                                    -1e9).astype(q.dtype)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum(out_spec, probs, v).reshape(b, t, h * d)
    return checkpoint_name(out, "context")


def conv(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    """2-D convolution, NHWC input, HWIO kernel, ``SAME`` padding."""
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer ``labels`` under ``logits`` (classes last), float32."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)
    return nll.astype(jnp.float32).mean()


def checkpointed(block: Block, policy: Callable | None, scan: bool = False) -> Block:
    """``block`` in a ``jax.checkpoint`` under ``policy``, or unchanged when ``policy`` is None.

    Inside ``lax.scan`` the checkpoint is made with ``prevent_cse=False``, as JAX advises:
    the loop already keeps the recomputation from being merged with the forward pass.
    """
    if policy is None:
        return block
    return jax.checkpoint(block, policy=policy, prevent_cse=not scan)


def run_layers(block: Block, layers: Any, x: jax.Array, scan: bool,
               policy: Callable | None) -> jax.Array:
    """``x`` through ``block(layer_params, x)`` for each layer, each layer checkpointed
    under ``policy``.

    Args:
      block: one layer.
      layers: a list of per-layer parameters, or (``scan``) one pytree stacked on axis 0.
      x: the input activations.
      scan: run the layers under ``jax.lax.scan`` over the stacked parameters.
      policy: a ``jax.checkpoint`` policy for every layer, or None for no checkpoint.
    """
    block = checkpointed(block, policy, scan)
    if scan:
        x, _ = jax.lax.scan(lambda h, p: (block(p, h), None), x, layers)
        return x
    for p in layers:
        x = block(p, x)
    return x
