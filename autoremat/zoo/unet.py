"""A U-Net for per-pixel classification, NHWC, with long skip connections.

The encoder runs a double convolution (3x3 convolution, group norm, SiLU, twice) per level
and halves the resolution with 2x2 average pooling; its output at every level is kept and
concatenated, across the whole network, to the decoder's input at the same resolution.
The lowest level adds a self-attention block over its pixels (fused ``qkv_proj``,
``context`` and ``out_proj`` carry MaxText's names). The decoder doubles the resolution
(nearest neighbour) before each double convolution; a 1x1 convolution gives per-pixel
class logits. Activations stay in the parameter dtype (bf16 at full size).

:data:`UNET` has 8.8M parameters and saves about 4.6 GiB of residuals for the backward
pass without remat; :data:`UNET_TINY` is for tests.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from autoremat.zoo import _layers

Params = dict[str, Any]

NAMES = ("qkv_proj", "context", "out_proj")


@dataclasses.dataclass(frozen=True)
class UNetConfig:
    """Model and batch shapes. ``channels[i]`` is the width at resolution
    ``image_size / 2**i``; the last entry is the attention level."""

    channels: tuple[int, ...] = (64, 128, 256, 512)
    groups: int = 32
    n_head: int = 8
    n_classes: int = 8
    image_size: int = 256
    batch: int = 8
    dtype: Any = jnp.bfloat16


UNET = UNetConfig()
UNET_TINY = UNetConfig(channels=(8, 16, 32), groups=4, n_head=2, n_classes=3, image_size=16,
                       batch=2, dtype=jnp.float32)


def describe(c: UNetConfig) -> str:
    """One line: levels, shapes and dtype."""
    return (f"U-Net, {len(c.channels)} levels of width {'-'.join(map(str, c.channels))} "
            f"with concatenated skips and attention at the lowest, "
            f"{c.image_size}x{c.image_size}x3 NHWC, batch {c.batch}, {c.n_classes} classes, "
            f"group norm, {jnp.dtype(c.dtype).name}")


def _double_conv_shapes(cin: int, cout: int) -> dict[str, tuple[int, ...]]:
    return {"conv1": (3, 3, cin, cout), "gn1_g": (cout,), "gn1_b": (cout,),
            "conv2": (3, 3, cout, cout), "gn2_g": (cout,), "gn2_b": (cout,)}


def param_shapes(c: UNetConfig) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    ch, top = c.channels, c.channels[-1]
    return _layers.as_shapes({
        "down": [_double_conv_shapes(cin, cout)
                 for cin, cout in zip((3, *ch[:-2]), ch[:-1], strict=True)],
        "mid": _double_conv_shapes(ch[-2], top),
        "attn": {"norm_g": (top,), "norm_b": (top,), "w_qkv": (top, 3 * top),
                 "b_qkv": (3 * top,), "w_out": (top, top), "b_out": (top,)},
        "up": [_double_conv_shapes(below + skip, skip)
               for below, skip in zip(ch[:0:-1], ch[-2::-1], strict=True)],
        "head": (1, 1, ch[0], c.n_classes), "b_head": (c.n_classes,),
    }, c.dtype)


def batch_shapes(c: UNetConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Images (NHWC) and integer per-pixel labels."""
    hw = (c.image_size, c.image_size)
    return {"images": jax.ShapeDtypeStruct((c.batch, *hw, 3), c.dtype),
            "labels": jax.ShapeDtypeStruct((c.batch, *hw), jnp.int32)}


def init_params(c: UNetConfig, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; norm gains 1, biases 0)."""
    return _layers.init_params(param_shapes(c), key)


def init_batch(c: UNetConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Standard normal images and random per-pixel labels."""
    k1, k2 = jax.random.split(key)
    hw = (c.image_size, c.image_size)
    return {"images": jax.random.normal(k1, (c.batch, *hw, 3)).astype(c.dtype),
            "labels": jax.random.randint(k2, (c.batch, *hw), 0, c.n_classes)}


def double_conv(p: Params, x: jax.Array, groups: int) -> jax.Array:
    """Two rounds of 3x3 convolution, group norm and SiLU on NHWC ``x``."""
    for i in (1, 2):
        x = _layers.conv(x, p[f"conv{i}"])
        x = jax.nn.silu(_layers.group_norm(x, p[f"gn{i}_g"], p[f"gn{i}_b"], groups))
    return x


def attention_block(p: Params, x: jax.Array, groups: int, n_head: int) -> jax.Array:
    """Residual self-attention over all pixels of NHWC ``x``."""
    n, h, w, ch = x.shape
    t = _layers.group_norm(x, p["norm_g"], p["norm_b"], groups).reshape(n, h * w, ch)
    qkv = checkpoint_name(t @ p["w_qkv"] + p["b_qkv"], "qkv_proj")
    attn = _layers.attention(*_layers.split_qkv(qkv, n_head), causal=False)
    out = checkpoint_name(attn @ p["w_out"] + p["b_out"], "out_proj")
    return x + out.reshape(x.shape)


def _pool(x: jax.Array) -> jax.Array:
    n, h, w, ch = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, ch).mean(axis=(2, 4))


def _upsample(x: jax.Array) -> jax.Array:
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


def make_loss(c: UNetConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch) -> scalar`` mean per-pixel cross-entropy.

    Args:
      c: the configuration.
      layer_policy: a ``jax.checkpoint`` policy applied to every double convolution and
        to the attention block, or None for no checkpoint.
    """
    conv_block = _layers.checkpointed(functools.partial(double_conv, groups=c.groups),
                                      layer_policy)
    attn_block = _layers.checkpointed(
        functools.partial(attention_block, groups=c.groups, n_head=c.n_head), layer_policy)

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        x, skips = batch["images"], []
        for p in params["down"]:
            x = conv_block(p, x)
            skips.append(x)
            x = _pool(x)
        x = attn_block(params["attn"], conv_block(params["mid"], x))
        for p, skip in zip(params["up"], reversed(skips), strict=True):
            x = conv_block(p, jnp.concatenate([_upsample(x), skip], axis=-1))
        logits = _layers.conv(x, params["head"]) + params["b_head"]
        return _layers.cross_entropy(logits, batch["labels"])

    return loss
