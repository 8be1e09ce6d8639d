"""Small models for tests: each returns (loss_fn, args) with concrete arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import ad_checkpoint
from jax._src import core as jax_core
from jax._src.lax import lax as lax_internal

from autoremat._planner._candidates import within_model_error
from autoremat.zoo import gpt2


def saved_residuals(fn: Any, *args: Any) -> list[tuple[Any, str]]:
    """JAX's ``saved_residuals(fn, *args)``, each saved buffer listed once.

    With ``jax_remat3`` the VJP of a scan can list one residual twice (the same variable,
    one buffer), which JAX's own utility rejects with an assertion.
    """
    closed, shapes = jax.make_jaxpr(lambda *a: jax.vjp(fn, *a), return_shape=True)(*args)
    jaxpr = closed.jaxpr
    num_res = len(jax.tree.leaves(shapes[1]))
    marker = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
              if e.primitive is lax_internal.reduce_precision_p}
    outs = jaxpr.outvars[len(jaxpr.outvars) - num_res:]
    unique = {marker.get(v, v): v for v in outs if not isinstance(v, jax_core.Literal)}
    literals = [v for v in outs if isinstance(v, jax_core.Literal)]
    jaxpr = jaxpr.replace(outvars=[*literals, *unique.values()])
    return ad_checkpoint._saved_residuals(jaxpr, ("argument",) * len(jaxpr.invars))


def fits_under_the_model(plan: Any) -> bool:
    """Whether the plan's modelled peak is within its budget, or the plan is the function as
    written standing for a plan near no remat, its activation memory over the budget's by
    less than the model's error (``autoremat._planner._search.as_written_near_no_remat``)."""
    return plan.peak_bytes <= plan.budget_bytes or plan.no_remat and within_model_error(
        plan.budget_bytes, plan.peak_bytes, plan.graph.fixed_bytes)


def mlp() -> tuple[Any, tuple]:
    """A 4-layer tanh MLP; params as a list of dicts."""
    keys = jax.random.split(jax.random.key(0), 6)
    params = [{"w": jax.random.normal(keys[i], (48, 48)) / 7, "b": jnp.full((48,), 0.1)}
              for i in range(4)]
    x = jax.random.normal(keys[5], (256, 48))

    def loss(params: list, x: jax.Array) -> jax.Array:
        for layer in params:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return jnp.mean(x ** 2)

    return loss, (params, x)


def transformer_block() -> tuple[Any, tuple]:
    """One GPT-2 block; params as a dict."""
    c = gpt2.GPT2_TINY
    params = gpt2.init_params(c, jax.random.key(1))["layers"][0]
    x = jax.random.normal(jax.random.key(2), (c.batch, c.seq_len, c.d_model))

    def loss(p: dict, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.sin(gpt2.block(p, x, c.n_head)))

    return loss, (params, x)


def gpt2_tiny(scan_layers: bool) -> tuple[Any, tuple]:
    """The 4-layer tiny GPT-2, unrolled (list of layer dicts) or scanned (stacked)."""
    c = dataclasses.replace(gpt2.GPT2_TINY, scan_layers=scan_layers)
    return gpt2.make_loss(c), (gpt2.init_params(c, jax.random.key(3)),
                               gpt2.init_batch(c, jax.random.key(4)))


def cnn() -> tuple[Any, tuple]:
    """A small residual CNN: conv stem, two residual blocks with skip connections, head."""
    k = jax.random.split(jax.random.key(5), 8)
    conv = lambda key, cin, cout: jax.random.normal(key, (3, 3, cin, cout)) / (3 * cin ** 0.5)
    params = {
        "stem": conv(k[0], 3, 8),
        "blocks": [{"c1": conv(k[1 + 2 * i], 8, 8), "c2": conv(k[2 + 2 * i], 8, 8)}
                   for i in range(2)],
        "head": jax.random.normal(k[6], (8, 10)) / 3,
    }
    images = jax.random.normal(k[7], (4, 16, 16, 3))

    def apply_conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(params: dict, images: jax.Array) -> jax.Array:
        x = jax.nn.relu(apply_conv(images, params["stem"]))
        for blk in params["blocks"]:
            h = jax.nn.relu(apply_conv(x, blk["c1"]))
            x = jax.nn.relu(x + apply_conv(h, blk["c2"]))
        logits = x.mean(axis=(1, 2)) @ params["head"]
        return -jnp.mean(jax.nn.log_softmax(logits)[:, 0])

    return loss, (params, images)


def norm_mlp() -> tuple[Any, tuple]:
    """An 8-layer MLP normalizing each layer's pre-activations by their per-feature mean
    and mean square (a group norm's statistics)."""
    keys = jax.random.split(jax.random.key(6), 9)
    params = [jax.random.normal(k, (48, 48)) / 7 for k in keys[:8]]
    x = jax.random.normal(keys[8], (256, 48))

    def loss(params: list, x: jax.Array) -> jax.Array:
        for w in params:
            h = x @ w
            total, square = jnp.sum(h, axis=0), jnp.sum(h * h, axis=0)
            mean = total / h.shape[0]
            x = jnp.sin((h - mean) * jax.lax.rsqrt(square / h.shape[0] - mean * mean + 1e-5))
        return jnp.mean(x ** 2)

    return loss, (params, x)


MODELS = {
    "mlp": mlp,
    "norm_mlp": norm_mlp,
    "transformer_block": transformer_block,
    "gpt2_unrolled": lambda: gpt2_tiny(False),
    "gpt2_scanned": lambda: gpt2_tiny(True),
    "cnn": cnn,
}


@jax.custom_vjp
def _clipped_square(x: jax.Array) -> jax.Array:
    return x * x


def _clipped_square_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x * x, jnp.sin(x)


def _clipped_square_bwd(res: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (jnp.clip(2 * res * g, -1.0, 1.0),)


_clipped_square.defvjp(_clipped_square_fwd, _clipped_square_bwd)


def control_flow() -> tuple[Any, tuple]:
    """cond, a custom_vjp function, a jitted helper and a scan nested in a scan."""
    k = jax.random.split(jax.random.key(6), 3)
    params = {"w": jax.random.normal(k[0], (24, 24)) / 5,
              "v": jax.random.normal(k[1], (3, 24, 24)) / 5}
    x = jax.random.normal(k[2], (8, 24))

    @jax.jit
    def dense(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    def loss(params: dict, x: jax.Array) -> jax.Array:
        h = dense(x, params["w"])
        h = jax.lax.cond(h.sum() > 0, lambda a: jnp.sin(a) * a, lambda a: jnp.cos(a), h)
        h = _clipped_square(h)

        def outer(c, v):
            inner, _ = jax.lax.scan(lambda a, _: (jnp.tanh(a @ v), None), c, None, length=2)
            return inner + c, None

        h, _ = jax.lax.scan(outer, h, params["v"])
        return jnp.mean(dense(h, params["w"]) ** 2)

    return loss, (params, x)


MODELS["control_flow"] = control_flow
