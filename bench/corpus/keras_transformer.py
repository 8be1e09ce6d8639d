"""A GPT-style decoder language model in Keras 3 on JAX (``keras.layers.Embedding``,
``MultiHeadAttention``, ``LayerNormalization``, ``Dense``), a functional ``keras.Model``.

Token and learned position embeddings, pre-norm blocks of causal self-attention
(``use_causal_mask=True``) and a GELU MLP, a final LayerNormalization and a dense head over
the vocabulary; Keras's sparse categorical cross-entropy of random next tokens. The loss
runs ``model.stateless_call`` with the trainable variables (by path) as the parameters.
With a layer policy every block is rematerialized through Keras's ``RematScope`` hook with
that policy (see :mod:`bench.corpus._keras`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from bench.corpus import _keras
from bench.corpus._common import dtype_name, registered
from bench.corpus._keras import keras


@dataclasses.dataclass(frozen=True)
class KerasTransformerConfig:
    """Model and batch shapes."""

    n_layer: int = 6
    d_model: int = 512
    n_head: int = 8
    d_mlp: int = 2048
    vocab: int = 8192
    seq: int = 512
    batch: int = 4
    dtype: str = "bfloat16"


FULL = KerasTransformerConfig()
TINY = KerasTransformerConfig(n_layer=2, d_model=16, n_head=2, d_mlp=32, vocab=32, seq=8,
                              batch=2, dtype="float32")


class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embeddings plus learned position embeddings."""

    def __init__(self, c: KerasTransformerConfig, **kwargs: Any):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(c.vocab, c.d_model, name="tokens",
                                             dtype=self.dtype_policy)
        self.positions = keras.layers.Embedding(c.seq, c.d_model, name="positions",
                                                dtype=self.dtype_policy)

    def call(self, tokens: Any) -> Any:
        positions = keras.ops.arange(tokens.shape[-1])
        return self.tokens(tokens) + self.positions(positions)


class TransformerBlock(_keras.RematBlock):
    """Causal self-attention and MLP, each residual around a LayerNormalization."""

    def __init__(self, c: KerasTransformerConfig, **kwargs: Any):
        super().__init__(**kwargs)
        kw: dict[str, Any] = {"dtype": self.dtype_policy}
        self.ln_attn = keras.layers.LayerNormalization(name="ln_attn", **kw)
        self.attn = keras.layers.MultiHeadAttention(c.n_head, c.d_model // c.n_head, name="attn",
                                                    **kw)
        self.ln_mlp = keras.layers.LayerNormalization(name="ln_mlp", **kw)
        self.mlp_in = keras.layers.Dense(c.d_mlp, activation="gelu", name="mlp_in", **kw)
        self.mlp_out = keras.layers.Dense(c.d_model, name="mlp_out", **kw)

    def call(self, x: Any) -> Any:
        h = self.ln_attn(x)
        x = x + self.attn(h, h, use_causal_mask=True)
        return x + self.mlp_out(self.mlp_in(self.ln_mlp(x)))


def build(c: KerasTransformerConfig, layer_policy: Callable | str | None = None) -> keras.Model:
    """The functional model, its blocks rematerialized under ``layer_policy``."""
    names = [f"block_{i}" for i in range(c.n_layer)]
    tokens = keras.Input((c.seq,), batch_size=c.batch, dtype="int32", name="tokens")
    x = TokenAndPositionEmbedding(c, name="embed", dtype=c.dtype)(tokens)
    with _keras.remat_scope(layer_policy, names):
        blocks = [TransformerBlock(c, remat_policy=layer_policy, name=n, dtype=c.dtype)
                  for n in names]
    for block in blocks:
        x = block(x)
    x = keras.layers.LayerNormalization(name="ln_final", dtype=c.dtype)(x)
    logits = keras.layers.Dense(c.vocab, use_bias=False, name="head", dtype=c.dtype)(x)
    return keras.Model(tokens, logits, name="decoder")


def make_loss(c: KerasTransformerConfig, layer_policy: Callable | str | None = None) -> Callable:
    """``loss(params, batch)``: mean next-token cross-entropy (Keras's, in float32)."""
    apply = _keras.stateless_apply(_keras.abstract(lambda: build(c, layer_policy)))

    def loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
        logits = apply(params, batch["tokens"]).astype(jnp.float32)
        nll: Any = keras.losses.sparse_categorical_crossentropy(batch["targets"], logits,
                                                                from_logits=True)
        return jnp.mean(nll)

    return loss


def param_shapes(c: KerasTransformerConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """The trainable variables by path, from a model built without values."""
    return dict(_param_shapes(c))


@functools.cache
def _param_shapes(c: Any) -> dict[str, jax.ShapeDtypeStruct]:
    return _keras.param_shapes(_keras.abstract(lambda: build(c)))


def batch_shapes(c: KerasTransformerConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Tokens and next tokens."""
    return {k: jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32) for k in ("tokens", "targets")}


def init(c: KerasTransformerConfig, key: jax.Array) -> tuple[dict[str, jax.Array], dict]:
    """Keras's initializers for the parameters; random tokens and targets."""
    k_params, k_tokens, k_targets = jax.random.split(key, 3)
    return _keras.init_params(lambda: build(c), k_params), {
        "tokens": jax.random.randint(k_tokens, (c.batch, c.seq), 0, c.vocab),
        "targets": jax.random.randint(k_targets, (c.batch, c.seq), 0, c.vocab)}


def describe(c: KerasTransformerConfig) -> str:
    """Architecture, shapes and dtype."""
    return (f"Keras 3 GPT-style decoder (functional keras.Model), {c.n_layer} pre-norm blocks "
            f"(MultiHeadAttention, causal, + GELU Dense MLP), d {c.d_model}, {c.n_head} heads, "
            f"MLP {c.d_mlp}, vocab {c.vocab}, seq {c.seq}, batch {c.batch}, "
            f"{dtype_name(c.dtype)}")


def models() -> list:
    """``keras-transformer`` and ``keras-transformer-tiny``."""
    return registered({"keras-transformer": FULL, "keras-transformer-tiny": TINY},
                      sys.modules[__name__], shapes_of_config=True, jit_init=False)
