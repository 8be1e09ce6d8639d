"""A GPT-2-style decoder (pre-LayerNorm, learned positions, GELU MLP, tied embeddings).

Activations stay in the parameter dtype (bf16 for :data:`GPT2_SMALL`), LayerNorm
statistics are computed in float32, and the causal mask is an additive bias.

Layers are unrolled (a Python loop) or scanned (``jax.lax.scan`` over stacked layer
parameters). :data:`GPT2_SMALL` has GPT-2 small's shapes; :data:`GPT2_TINY` is for tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


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


def _layer_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    d = c.d_model
    return {
        "ln1_g": (d,), "ln1_b": (d,), "w_qkv": (d, 3 * d), "b_qkv": (3 * d,),
        "w_out": (d, d), "b_out": (d,), "ln2_g": (d,), "ln2_b": (d,),
        "w_fc": (d, 4 * d), "b_fc": (4 * d,), "w_proj": (4 * d, d), "b_proj": (d,),
    }


def param_shapes(c: GPT2Config) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    sds = lambda shape: jax.ShapeDtypeStruct(shape, c.dtype)
    layer = _layer_shapes(c)
    if c.scan_layers:
        layers: Any = {k: sds((c.n_layer, *s)) for k, s in layer.items()}
    else:
        layers = [{k: sds(s) for k, s in layer.items()} for _ in range(c.n_layer)]
    return {"wte": sds((c.vocab, c.d_model)), "wpe": sds((c.seq_len, c.d_model)),
            "lnf_g": sds((c.d_model,)), "lnf_b": sds((c.d_model,)), "layers": layers}


def batch_shapes(c: GPT2Config) -> dict[str, jax.ShapeDtypeStruct]:
    """Token ids and next-token targets."""
    ids = jax.ShapeDtypeStruct((c.batch, c.seq_len), jnp.int32)
    return {"tokens": ids, "targets": ids}


def init_params(c: GPT2Config, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; LayerNorm gains 1, biases 0)."""
    shapes = param_shapes(c)
    leaves, tree = jax.tree.flatten_with_path(shapes)
    keys = jax.random.split(key, len(leaves))

    def init(path: Any, s: jax.ShapeDtypeStruct, k: jax.Array) -> jax.Array:
        name = str(path[-1].key)
        if name.endswith("_g"):
            return jnp.ones(s.shape, s.dtype)
        if name.startswith("b_") or name.endswith("_b"):
            return jnp.zeros(s.shape, s.dtype)
        return (0.02 * jax.random.normal(k, s.shape)).astype(s.dtype)

    return jax.tree.unflatten(tree, [init(p, s, k) for (p, s), k in zip(leaves, keys)])


def init_batch(c: GPT2Config, key: jax.Array) -> dict[str, jax.Array]:
    """Random token ids and targets."""
    k1, k2 = jax.random.split(key)
    shape = (c.batch, c.seq_len)
    return {"tokens": jax.random.randint(k1, shape, 0, c.vocab),
            "targets": jax.random.randint(k2, shape, 0, c.vocab)}


def _layer_norm(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * g + b


def block(p: Params, x: jax.Array, n_head: int) -> jax.Array:
    """One transformer block on activations ``x`` of shape ``(batch, seq, d)``."""
    B, T, D = x.shape
    h = _layer_norm(x, p["ln1_g"], p["ln1_b"])
    qkv = h @ p["w_qkv"] + p["b_qkv"]
    q, k, v = jnp.split(qkv.reshape(B, T, 3, n_head, D // n_head), 3, axis=2)
    q, k, v = (t[:, :, 0].transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(jnp.asarray(D // n_head, x.dtype))
    causal_bias = jnp.where(jnp.tril(jnp.ones((T, T), bool)), 0.0, -1e9).astype(x.dtype)
    probs = jax.nn.softmax(scores + causal_bias, axis=-1)
    attn = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    x = x + attn @ p["w_out"] + p["b_out"]
    h = _layer_norm(x, p["ln2_g"], p["ln2_b"])
    h = jax.nn.gelu(h @ p["w_fc"] + p["b_fc"])
    return x + h @ p["w_proj"] + p["b_proj"]


def make_loss(c: GPT2Config) -> Any:
    """``loss(params, batch) -> scalar`` mean next-token cross-entropy."""

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        tokens = batch["tokens"]
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
        if c.scan_layers:
            x, _ = jax.lax.scan(lambda h, p: (block(p, h, c.n_head), None), x, params["layers"])
        else:
            for p in params["layers"]:
                x = block(p, x, c.n_head)
        x = _layer_norm(x, params["lnf_g"], params["lnf_b"])
        logits = x @ params["wte"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
        return nll.astype(jnp.float32).mean()

    return loss
