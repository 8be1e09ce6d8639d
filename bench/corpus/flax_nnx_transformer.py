"""A GPT-style decoder language model in Flax NNX (``nnx.Embed``, ``nnx.MultiHeadAttention``,
``nnx.LayerNorm``, ``nnx.Linear``).

Token and learned position embeddings, pre-norm blocks of causal self-attention and a GELU
MLP, a final LayerNorm and a linear head over the vocabulary; next-token cross-entropy on
random tokens. The blocks are an ``nnx.List`` of unrolled modules (``scan_layers=False``;
with a layer policy each block call is ``nnx.remat``-ed) or one stacked module made with
``nnx.vmap`` and run under ``nnx.scan`` (with a layer policy the scanned body is
``nnx.remat(..., prevent_cse=False)``). Functional form: the parameters are the
``nnx.Param`` state of ``nnx.split``, and the loss ``nnx.merge``-s them with the graph.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from bench.corpus._common import cross_entropy, dtype_name, registered


@dataclasses.dataclass(frozen=True)
class NNXTransformerConfig:
    """Model and batch shapes."""

    n_layer: int = 6
    d_model: int = 512
    n_head: int = 8
    d_mlp: int = 2048
    vocab: int = 8192
    seq: int = 512
    batch: int = 4
    dtype: Any = jnp.bfloat16
    scan_layers: bool = False


FULL = NNXTransformerConfig()
TINY = NNXTransformerConfig(n_layer=2, d_model=16, n_head=2, d_mlp=32, vocab=32, seq=8,
                            batch=2, dtype=jnp.float32)


class Block(nnx.Module):
    """Causal self-attention and MLP, each residual around a LayerNorm."""

    def __init__(self, c: NNXTransformerConfig, rngs: nnx.Rngs):
        kw: dict[str, Any] = {"dtype": c.dtype, "param_dtype": c.dtype, "rngs": rngs}
        self.ln_attn = nnx.LayerNorm(c.d_model, **kw)
        self.attn = nnx.MultiHeadAttention(c.n_head, c.d_model, decode=False, keep_rngs=False,
                                           **kw)
        self.ln_mlp = nnx.LayerNorm(c.d_model, **kw)
        self.mlp_in = nnx.Linear(c.d_model, c.d_mlp, **kw)
        self.mlp_out = nnx.Linear(c.d_mlp, c.d_model, **kw)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_attn(x), mask=mask, deterministic=True)
        return x + self.mlp_out(nnx.gelu(self.mlp_in(self.ln_mlp(x))))


def _block(block: Block, x: jax.Array, mask: jax.Array) -> jax.Array:
    return block(x, mask)


class DecoderLM(nnx.Module):
    """Embeddings, blocks and the vocabulary head."""

    def __init__(self, c: NNXTransformerConfig, rngs: nnx.Rngs):
        kw: dict[str, Any] = {"dtype": c.dtype, "param_dtype": c.dtype, "rngs": rngs}
        self.config = c
        self.embed = nnx.Embed(c.vocab, c.d_model, **kw)
        self.pos_embed = nnx.Embed(c.seq, c.d_model, **kw)
        if c.scan_layers:
            @nnx.split_rngs(splits=c.n_layer)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def stack(rngs: nnx.Rngs) -> Block:
                return Block(c, rngs)

            self.blocks: Any = stack(rngs)  # one Block, its parameters stacked on axis 0
        else:
            self.blocks = nnx.List([Block(c, rngs) for _ in range(c.n_layer)])
        self.ln_final = nnx.LayerNorm(c.d_model, **kw)
        self.head = nnx.Linear(c.d_model, c.vocab, use_bias=False, **kw)

    def __call__(self, tokens: jax.Array, layer_policy: Callable | None = None) -> jax.Array:
        c = self.config
        x = self.embed(tokens) + self.pos_embed(jnp.arange(tokens.shape[1]))
        mask = nnx.make_causal_mask(tokens, dtype=jnp.bool_)
        if c.scan_layers:
            body = _block
            if layer_policy is not None:
                body = nnx.remat(body, policy=layer_policy, prevent_cse=False)
            x = nnx.scan(body, in_axes=(0, nnx.Carry, None), out_axes=nnx.Carry)(
                self.blocks, x, mask)
        else:
            call = _block if layer_policy is None else nnx.remat(_block, policy=layer_policy)
            for block in self.blocks:
                x = call(block, x, mask)
        return self.head(self.ln_final(x))


def _split(c: NNXTransformerConfig, key: jax.Array) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(DecoderLM(c, nnx.Rngs(params=key)), nnx.Param)  # pyright: ignore


@functools.cache
def _graphdef(c: NNXTransformerConfig) -> nnx.GraphDef:
    return nnx.eval_shape(lambda: _split(c, jax.random.key(0)))[0]


def make_loss(c: NNXTransformerConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean next-token cross-entropy."""
    graphdef = _graphdef(c)

    def loss(params: nnx.State, batch: dict[str, jax.Array]) -> jax.Array:
        model = nnx.merge(graphdef, params)
        return cross_entropy(model(batch["tokens"], layer_policy), batch["targets"])

    return loss


def init(c: NNXTransformerConfig, key: jax.Array) -> tuple[nnx.State, dict[str, jax.Array]]:
    """Flax's initializers for the parameters; random tokens and targets."""
    k_params, k_tokens, k_targets = jax.random.split(key, 3)
    _, params = _split(c, k_params)
    return params, {"tokens": jax.random.randint(k_tokens, (c.batch, c.seq), 0, c.vocab),
                    "targets": jax.random.randint(k_targets, (c.batch, c.seq), 0, c.vocab)}


def describe(c: NNXTransformerConfig) -> str:
    """Architecture, shapes and dtype."""
    return (f"Flax NNX GPT-style decoder, {c.n_layer} "
            f"{'nnx.scan-ned' if c.scan_layers else 'unrolled'} pre-norm blocks "
            f"(nnx.MultiHeadAttention, causal, + GELU MLP), d {c.d_model}, {c.n_head} heads, "
            f"MLP {c.d_mlp}, vocab {c.vocab}, seq {c.seq}, batch {c.batch}, "
            f"{dtype_name(c.dtype)}")


def models() -> list:
    """``nnx-transformer``, ``nnx-transformer-scan`` and their ``-tiny`` variants."""
    configs = {"nnx-transformer": FULL,
               "nnx-transformer-scan": dataclasses.replace(FULL, scan_layers=True),
               "nnx-transformer-tiny": TINY,
               "nnx-transformer-scan-tiny": dataclasses.replace(TINY, scan_layers=True)}
    return registered(configs, sys.modules[__name__])
