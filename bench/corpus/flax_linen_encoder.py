"""A pre-norm transformer encoder classifier in Flax Linen (``nn.Embed``,
``nn.MultiHeadDotProductAttention``, ``nn.LayerNorm``, ``nn.Dense``).

Token and learned position embeddings, blocks of bidirectional self-attention and a GELU
MLP (each ``x + f(LayerNorm(x))``), a final LayerNorm, mean pooling over the sequence and a
dense head. The blocks are unrolled (``scan_layers=False``; with a layer policy each block
is an ``nn.remat`` of the block class) or one ``nn.scan`` over stacked parameters (with a
layer policy the scanned body is ``nn.remat(..., prevent_cse=False)``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bench.corpus._common import cross_entropy, dtype_name, registered


@dataclasses.dataclass(frozen=True)
class LinenEncoderConfig:
    """Model and batch shapes."""

    n_layer: int = 6
    d_model: int = 512
    n_head: int = 8
    d_mlp: int = 2048
    vocab: int = 8192
    seq: int = 512
    n_classes: int = 10
    batch: int = 8
    dtype: Any = jnp.bfloat16
    scan_layers: bool = False


FULL = LinenEncoderConfig()
TINY = LinenEncoderConfig(n_layer=2, d_model=16, n_head=2, d_mlp=32, vocab=32, seq=8,
                          n_classes=5, batch=2, dtype=jnp.float32)


class EncoderBlock(nn.Module):
    """Self-attention and MLP, each residual around a LayerNorm; ``(x, None)`` out so that
    ``nn.scan`` can carry ``x``."""

    config: LinenEncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, _: Any = None) -> tuple[jax.Array, None]:
        c = self.config
        kw = {"dtype": c.dtype, "param_dtype": c.dtype}
        h = nn.LayerNorm(name="ln_attn", **kw)(x)
        x = x + nn.MultiHeadDotProductAttention(c.n_head, deterministic=True, name="attn",
                                                **kw)(h)
        h = nn.LayerNorm(name="ln_mlp", **kw)(x)
        h = nn.Dense(c.d_mlp, name="mlp_in", **kw)(h)
        return x + nn.Dense(c.d_model, name="mlp_out", **kw)(nn.gelu(h)), None


class Encoder(nn.Module):
    """Embeddings, blocks, pooling and head; ``layer_policy`` remats every block."""

    config: LinenEncoderConfig
    layer_policy: Callable | None = None

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        c = self.config
        kw = {"dtype": c.dtype, "param_dtype": c.dtype}
        x = nn.Embed(c.vocab, c.d_model, name="embed", **kw)(tokens)
        pos = self.param("pos_embed", nn.initializers.normal(0.02), (c.seq, c.d_model), c.dtype)
        x = x + pos
        block: Any = EncoderBlock
        if self.layer_policy is not None:
            block = nn.remat(block, policy=self.layer_policy, prevent_cse=not c.scan_layers)
        if c.scan_layers:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=c.n_layer)
            x, _ = stack(c, name="blocks")(x, None)
        else:
            for i in range(c.n_layer):
                x, _ = block(c, name=f"block_{i}")(x)
        x = nn.LayerNorm(name="ln_final", **kw)(x).mean(axis=1)
        return nn.Dense(c.n_classes, name="head", **kw)(x)


def make_loss(c: LinenEncoderConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the sequence labels."""
    model = Encoder(c, layer_policy)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits: Any = model.apply({"params": params}, batch["tokens"])
        return cross_entropy(logits, batch["labels"])

    return loss


def init(c: LinenEncoderConfig, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
    """Flax's initializers for the parameters; random tokens and labels."""
    k_params, k_tokens, k_labels = jax.random.split(key, 3)
    tokens = jax.random.randint(k_tokens, (c.batch, c.seq), 0, c.vocab)
    params = Encoder(c).init(k_params, tokens)["params"]
    labels = jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)
    return params, {"tokens": tokens, "labels": labels}


def describe(c: LinenEncoderConfig) -> str:
    """Architecture, shapes and dtype."""
    return (f"Flax Linen transformer encoder, {c.n_layer} "
            f"{'nn.scan-ned' if c.scan_layers else 'unrolled'} pre-norm blocks "
            f"(nn.MultiHeadDotProductAttention + GELU MLP), d {c.d_model}, {c.n_head} heads, "
            f"MLP {c.d_mlp}, vocab {c.vocab}, seq {c.seq}, batch {c.batch}, mean-pooled "
            f"{c.n_classes}-class head, {dtype_name(c.dtype)}")


def models() -> list:
    """``linen-encoder``, ``linen-encoder-scan`` and their ``-tiny`` variants."""
    configs = {"linen-encoder": FULL,
               "linen-encoder-scan": dataclasses.replace(FULL, scan_layers=True),
               "linen-encoder-tiny": TINY,
               "linen-encoder-scan-tiny": dataclasses.replace(TINY, scan_layers=True)}
    return registered(configs, sys.modules[__name__])
