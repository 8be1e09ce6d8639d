"""A GPT-2-style decoder (pre-LayerNorm, learned positions, GELU MLP, tied embeddings).

Activations stay in the parameter dtype (bf16 for :data:`GPT2_SMALL`); see
:mod:`autoremat.zoo._layers` for where float32 is used. The causal mask is an additive
bias. Projections carry MaxText's ``checkpoint_name`` names (:data:`NAMES`).

Layers are unrolled (a Python loop) or scanned (``jax.lax.scan`` over stacked layer
parameters). :data:`GPT2_SMALL` has GPT-2 small's shapes (124.5M parameters; about
11.0 GiB of residuals saved for the backward pass without remat); :data:`GPT2_TINY` is for
tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from autoremat.zoo import _layers

Params = dict[str, Any]

NAMES = ("qkv_proj", "context", "out_proj", "mlpwi", "mlpwo")


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Model and batch shapes."""

    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    seq_len: int = 1024
    vocab: int = 50304
    batch: int = 8
    dtype: Any = jnp.bfloat16
    scan_layers: bool = False


GPT2_SMALL = GPT2Config()
GPT2_TINY = GPT2Config(n_layer=4, d_model=64, n_head=4, seq_len=32, vocab=128, batch=2,
                       dtype=jnp.float32)


def describe(c: GPT2Config) -> str:
    """One line: layers, shapes and dtype."""
    return (f"GPT-2-style decoder, {c.n_layer} {'scanned' if c.scan_layers else 'unrolled'} "
            f"layers, d {c.d_model}, {c.n_head} heads, seq {c.seq_len}, batch {c.batch}, "
            f"vocab {c.vocab}, {jnp.dtype(c.dtype).name}")


def _layer_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    d = c.d_model
    return {
        "ln1_g": (d,), "ln1_b": (d,), "w_qkv": (d, 3 * d), "b_qkv": (3 * d,),
        "w_out": (d, d), "b_out": (d,), "ln2_g": (d,), "ln2_b": (d,),
        "w_fc": (d, 4 * d), "b_fc": (4 * d,), "w_proj": (4 * d, d), "b_proj": (d,),
    }


def param_shapes(c: GPT2Config) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    d = c.d_model
    return _layers.as_shapes(
        {"wte": (c.vocab, d), "wpe": (c.seq_len, d), "lnf_g": (d,), "lnf_b": (d,),
         "layers": _layers.stacked(_layer_shapes(c), c.n_layer, c.scan_layers)}, c.dtype)


def batch_shapes(c: GPT2Config) -> dict[str, jax.ShapeDtypeStruct]:
    """Token ids and next-token targets."""
    ids = jax.ShapeDtypeStruct((c.batch, c.seq_len), jnp.int32)
    return {"tokens": ids, "targets": ids}


def init_params(c: GPT2Config, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; LayerNorm gains 1, biases 0)."""
    return _layers.init_params(param_shapes(c), key)


def init_batch(c: GPT2Config, key: jax.Array) -> dict[str, jax.Array]:
    """Random token ids and targets."""
    k1, k2 = jax.random.split(key)
    shape = (c.batch, c.seq_len)
    return {"tokens": jax.random.randint(k1, shape, 0, c.vocab),
            "targets": jax.random.randint(k2, shape, 0, c.vocab)}


def block(p: Params, x: jax.Array, n_head: int) -> jax.Array:
    """One transformer block on activations ``x`` of shape ``(batch, seq, d)``."""
    h = _layers.layer_norm(x, p["ln1_g"], p["ln1_b"])
    qkv = checkpoint_name(h @ p["w_qkv"] + p["b_qkv"], "qkv_proj")
    attn = _layers.attention(*_layers.split_qkv(qkv, n_head), causal=True)
    x = x + checkpoint_name(attn @ p["w_out"] + p["b_out"], "out_proj")
    h = _layers.layer_norm(x, p["ln2_g"], p["ln2_b"])
    h = jax.nn.gelu(checkpoint_name(h @ p["w_fc"] + p["b_fc"], "mlpwi"))
    return x + checkpoint_name(h @ p["w_proj"] + p["b_proj"], "mlpwo")


def make_loss(c: GPT2Config, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch) -> scalar`` mean next-token cross-entropy.

    Args:
      c: the configuration.
      layer_policy: a ``jax.checkpoint`` policy applied to every block, or None for no
        checkpoint.
    """

    def layer(p: Params, x: jax.Array) -> jax.Array:
        return block(p, x, c.n_head)

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        tokens = batch["tokens"]
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
        x = _layers.run_layers(layer, params["layers"], x, c.scan_layers, layer_policy)
        x = _layers.layer_norm(x, params["lnf_g"], params["lnf_b"])
        return _layers.cross_entropy(x @ params["wte"].T, batch["targets"])

    return loss
