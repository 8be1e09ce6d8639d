"""A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

Pre-norm blocks without biases, untied input embedding and output head. Layers run under
``jax.lax.scan`` over stacked parameters (``scan_layers=True``, the default) or unrolled.
Activations stay in the parameter dtype (bf16 at full size); see
:mod:`autoremat.zoo._layers` for where float32 is used. Projections carry MaxText's
``checkpoint_name`` names (:data:`NAMES`), the SwiGLU gate and up projections as
``mlpwi_0`` and ``mlpwi_1``.

:data:`LLAMA` has 200.8M parameters (12 layers, d 1024) and saves about 12.4 GiB of
residuals for the backward pass without remat; :data:`LLAMA_24` doubles the depth (336.1M
parameters, about 24.25 GiB) for planning-time benchmarks; :data:`LLAMA_TINY` is for tests.
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

NAMES = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0",
         "mlpwi_1", "mlpwo")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Model and batch shapes. ``d_model`` is ``n_head * head_dim``; ``n_head`` is a
    multiple of ``n_kv_head``."""

    n_layer: int = 12
    d_model: int = 1024
    n_head: int = 16
    n_kv_head: int = 4
    d_ff: int = 2816
    seq_len: int = 1024
    vocab: int = 32000
    batch: int = 8
    dtype: Any = jnp.bfloat16
    scan_layers: bool = True

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head


LLAMA = LlamaConfig()
LLAMA_24 = LlamaConfig(n_layer=24)
LLAMA_TINY = LlamaConfig(n_layer=4, d_model=64, n_head=4, n_kv_head=2, d_ff=96, seq_len=32,
                         vocab=128, batch=2, dtype=jnp.float32)


def describe(c: LlamaConfig) -> str:
    """One line: layers, shapes and dtype."""
    return (f"Llama-style decoder, {c.n_layer} {'scanned' if c.scan_layers else 'unrolled'} "
            f"layers, d {c.d_model}, {c.n_head} query / {c.n_kv_head} kv heads, SwiGLU "
            f"{c.d_ff}, seq {c.seq_len}, batch {c.batch}, vocab {c.vocab}, "
            f"{jnp.dtype(c.dtype).name}")


def _layer_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    d, kv = c.d_model, c.n_kv_head * c.head_dim
    return {
        "attn_norm_g": (d,), "w_q": (d, d), "w_k": (d, kv), "w_v": (d, kv), "w_o": (d, d),
        "mlp_norm_g": (d,), "w_gate": (d, c.d_ff), "w_up": (d, c.d_ff), "w_down": (c.d_ff, d),
    }


def param_shapes(c: LlamaConfig) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    d = c.d_model
    return _layers.as_shapes(
        {"embed": (c.vocab, d), "final_norm_g": (d,), "head": (d, c.vocab),
         "layers": _layers.stacked(_layer_shapes(c), c.n_layer, c.scan_layers)}, c.dtype)


def batch_shapes(c: LlamaConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Token ids and next-token targets."""
    ids = jax.ShapeDtypeStruct((c.batch, c.seq_len), jnp.int32)
    return {"tokens": ids, "targets": ids}


def init_params(c: LlamaConfig, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; norm gains 1)."""
    return _layers.init_params(param_shapes(c), key)


def init_batch(c: LlamaConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Random token ids and targets."""
    k1, k2 = jax.random.split(key)
    shape = (c.batch, c.seq_len)
    return {"tokens": jax.random.randint(k1, shape, 0, c.vocab),
            "targets": jax.random.randint(k2, shape, 0, c.vocab)}


def block(p: Params, x: jax.Array, c: LlamaConfig) -> jax.Array:
    """One decoder block on activations ``x`` of shape ``(batch, seq, d_model)``."""
    B, T, _ = x.shape
    heads = lambda t, n: t.reshape(B, T, n, c.head_dim)  # (batch, seq, n, head_dim)
    h = _layers.rms_norm(x, p["attn_norm_g"])
    q = heads(checkpoint_name(h @ p["w_q"], "query_proj"), c.n_head)
    k = heads(checkpoint_name(h @ p["w_k"], "key_proj"), c.n_kv_head)
    v = heads(checkpoint_name(h @ p["w_v"], "value_proj"), c.n_kv_head)
    attn = _layers.attention(_layers.rope(q), _layers.rope(k), v, causal=True)
    x = x + checkpoint_name(attn @ p["w_o"], "out_proj")
    h = _layers.rms_norm(x, p["mlp_norm_g"])
    gate = checkpoint_name(h @ p["w_gate"], "mlpwi_0")
    up = checkpoint_name(h @ p["w_up"], "mlpwi_1")
    return x + checkpoint_name((jax.nn.silu(gate) * up) @ p["w_down"], "mlpwo")


def make_loss(c: LlamaConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch) -> scalar`` mean next-token cross-entropy.

    Args:
      c: the configuration.
      layer_policy: a ``jax.checkpoint`` policy applied to every block, or None for no
        checkpoint.
    """

    def layer(p: Params, x: jax.Array) -> jax.Array:
        return block(p, x, c)

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        x = params["embed"][batch["tokens"]]
        x = _layers.run_layers(layer, params["layers"], x, c.scan_layers, layer_policy)
        x = _layers.rms_norm(x, params["final_norm_g"])
        return _layers.cross_entropy(x @ params["head"], batch["targets"])

    return loss
