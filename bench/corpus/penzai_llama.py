"""penzai's own Llama-like transformer (``penzai.models.transformer.variants.llamalike_common``):
RMSNorm, grouped-query causal attention with RoPE, SwiGLU MLP, an untied vocabulary head.

The model is ``build_llamalike_transformer`` of a ``LlamalikeTransformerConfig``, its
blocks unrolled or (``use_layer_stack``) one ``pz.nn.LayerStack`` run under
``jax.lax.scan``. With a layer policy every ``TransformerBlock`` (the scanned body, in a
layer stack) is wrapped in penzai's ``gradient_checkpointing.Checkpointed`` with that
policy, as penzai's documentation shows (``pz.select(model).at_instances_of(...)
.apply(Checkpointed)``); ``Checkpointed`` calls ``jax.checkpoint`` with the default
``prevent_cse=True``, in a layer stack too. The parameters are the model's parameter values
(``pz.unbind_params``) by label, as plain arrays; the loss binds them to the model built
without parameters (``init_base_rng=None``: parameter slots).

penzai's builder gives the vocabulary head float32 weights whatever ``parameter_dtype``
says, so the full-size model is bfloat16 but for that head (and its logits).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from penzai import pz
from penzai.models.transformer import model_parts
from penzai.models.transformer.variants import llamalike_common
from penzai.toolshed import gradient_checkpointing

from bench.corpus._common import cross_entropy, dtype_name, registered


@dataclasses.dataclass(frozen=True)
class PenzaiLlamaConfig:
    """Model and batch shapes (the ``LlamalikeTransformerConfig`` fields, and the batch)."""

    n_layer: int = 6
    d_model: int = 512
    n_kv_head: int = 2
    query_head_multiplier: int = 4
    head_dim: int = 64
    d_mlp: int = 1408
    vocab: int = 8192
    seq: int = 512
    batch: int = 4
    dtype: Any = jnp.bfloat16
    layer_stack: bool = False

    def penzai_config(self) -> llamalike_common.LlamalikeTransformerConfig:
        return llamalike_common.LlamalikeTransformerConfig(
            num_kv_heads=self.n_kv_head, query_head_multiplier=self.query_head_multiplier,
            embedding_dim=self.d_model, projection_dim=self.head_dim, mlp_hidden_dim=self.d_mlp,
            num_decoder_blocks=self.n_layer, vocab_size=self.vocab, mlp_variant="swiglu",
            tie_embedder_and_logits=False, parameter_dtype=self.dtype,
            activation_dtype=self.dtype, use_layer_stack=self.layer_stack)


FULL = PenzaiLlamaConfig()
TINY = PenzaiLlamaConfig(n_layer=2, d_model=16, n_kv_head=2, query_head_multiplier=2,
                         head_dim=4, d_mlp=32, vocab=32, seq=8, batch=2, dtype=jnp.float32)


def _build(c: PenzaiLlamaConfig, key: jax.Array | None) -> model_parts.TransformerLM:
    return llamalike_common.build_llamalike_transformer(c.penzai_config(), init_base_rng=key)


def _values(c: PenzaiLlamaConfig, key: jax.Array) -> tuple[pz.ParameterValue, ...]:
    return pz.unbind_params(_build(c, key), freeze=True)[1]


@functools.cache
def _value_tree(c: PenzaiLlamaConfig) -> tuple[Any, tuple[str, ...]]:
    """The tree of parameter values (one array leaf each) and their labels in order."""
    values = jax.eval_shape(lambda key: _values(c, key), jax.random.key(0))
    return jax.tree.structure(values), tuple(v.label for v in values)


def make_loss(c: PenzaiLlamaConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean next-token cross-entropy."""
    unbound = _build(c, None)
    if layer_policy is not None:
        unbound = (pz.select(unbound).at_instances_of(model_parts.TransformerBlock)
                   .apply(lambda block: gradient_checkpointing.Checkpointed(block, layer_policy)))
    tree, labels = _value_tree(c)

    def loss(params: dict[str, jax.Array], batch: dict[str, jax.Array]) -> jax.Array:
        values = jax.tree.unflatten(tree, [params[label] for label in labels])
        model = pz.bind_variables(unbound, values)
        logits = model(pz.nx.wrap(batch["tokens"]).tag("batch", "seq"))
        return cross_entropy(logits.unwrap("batch", "seq", "vocabulary"), batch["targets"])

    return loss


def init(c: PenzaiLlamaConfig, key: jax.Array) -> tuple[dict[str, jax.Array], dict]:
    """penzai's initializers for the parameters; random tokens and targets."""
    k_params, k_tokens, k_targets = jax.random.split(key, 3)
    params = {v.label: v.value.data_array for v in _values(c, k_params)}
    return params, {"tokens": jax.random.randint(k_tokens, (c.batch, c.seq), 0, c.vocab),
                    "targets": jax.random.randint(k_targets, (c.batch, c.seq), 0, c.vocab)}


def describe(c: PenzaiLlamaConfig) -> str:
    """Architecture, shapes and dtype."""
    heads = c.n_kv_head * c.query_head_multiplier
    return (f"penzai Llama-like transformer (build_llamalike_transformer), {c.n_layer} "
            f"{'LayerStack-scanned' if c.layer_stack else 'unrolled'} blocks, d {c.d_model}, "
            f"{heads} query / {c.n_kv_head} kv heads of {c.head_dim}, SwiGLU {c.d_mlp}, vocab "
            f"{c.vocab}, seq {c.seq}, batch {c.batch}, {dtype_name(c.dtype)}"
            f"{' (float32 head)' if c.dtype != jnp.float32 else ''}")


def models() -> list:
    """``penzai-llama``, ``penzai-llama-stack`` and their ``-tiny`` variants."""
    configs = {"penzai-llama": FULL,
               "penzai-llama-stack": dataclasses.replace(FULL, layer_stack=True),
               "penzai-llama-tiny": TINY,
               "penzai-llama-stack-tiny": dataclasses.replace(TINY, layer_stack=True)}
    return registered(configs, sys.modules[__name__])
