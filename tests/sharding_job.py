"""Sharded planning checks that need several devices, run by ``tests/test_sharding.py``
in a subprocess whose environment sets ``XLA_FLAGS=--xla_force_host_platform_device_count``
(it takes effect only before JAX starts): 8 devices, or 4 in each of two processes.

``python tests/sharding_job.py checks`` plans sharded steps on 8 CPU devices and prints
one JSON object of figures; ``python tests/sharding_job.py digest [PORT PROCESS_ID]``
prints the digest of one sharded plan, as process ``PROCESS_ID`` of a two-process
``jax.distributed`` job on ``127.0.0.1:PORT`` when those are given.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import autoremat
from autoremat import zoo

BUDGET = 0.5

# Megatron-style tensor parallelism: column-split in, row-split out projections.
_TP = {"w_qkv": P(None, "model"), "b_qkv": P("model"), "w_fc": P(None, "model"),
       "b_fc": P("model"), "w_out": P("model", None), "w_proj": P("model", None)}


def _mesh(explicit: bool = False) -> jax.sharding.Mesh:
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))


def _specs(params: Any, style: str) -> Any:
    if style == "tp":
        return jax.tree.map_with_path(lambda path, _: _TP.get(str(path[-1].key), P()), params)
    return jax.tree.map(lambda _: P(("data", "model")), params)  # FSDP: first axis over all


def _shard(tree: Any, specs: Any, mesh: jax.sharding.Mesh) -> Any:
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)


def _plan(fn: Any, *args: Any, budget: Any = BUDGET) -> autoremat.Plan:
    try:
        return autoremat.plan(fn, *args, budget=budget)
    except autoremat.InfeasibleBudgetError as e:
        return autoremat.plan(fn, *args, budget=e.floor_bytes)


def _max_error(expected: Any, actual: Any) -> float:
    """Largest gradient difference relative to the gradient's largest entry."""
    errors = []
    for g0, g1 in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        g0, g1 = np.asarray(g0), np.asarray(g1)
        errors.append(float(np.max(np.abs(g0 - g1))) / max(1e-30, float(np.max(np.abs(g0)))))
    return max(errors)


def _figures(plan: autoremat.Plan) -> dict[str, Any]:
    return {"peak": plan.peak_bytes, "no_remat_peak": plan.no_remat_peak_bytes,
            "budget": plan.budget_bytes, "arg_bytes": plan.graph.arg_bytes,
            "value_bytes": sum(v.nbytes for v in plan.graph.values),
            "recompute_flops": plan.recompute_flops, "step_flops": plan.step_flops}


def _gpt2(style: str) -> dict[str, Any]:
    """A GPT-2-style step: tensor plus data parallel (``tp``) or FSDP (``fsdp``)."""
    model = zoo.get("gpt2-small-tiny")
    loss = model.make_loss()
    params, batch = model.init(jax.random.key(0))
    mesh = _mesh()
    sharded_params = _shard(params, _specs(params, style), mesh)
    sharded_batch = _shard(batch, jax.tree.map(lambda _: P("data"), batch), mesh)
    full = _plan(loss, params, batch)
    sharded = _plan(loss, sharded_params, sharded_batch)
    grads = jax.jit(jax.grad(sharded.apply(loss)))(sharded_params, sharded_batch)
    smaller = all(s.nbytes <= f.nbytes for s, f in
                  zip(sharded.graph.values, full.graph.values, strict=True))
    return {"full": _figures(full), "sharded": _figures(sharded),
            "each_value_smaller_or_equal": smaller,
            "grad_error": _max_error(jax.grad(loss)(params, batch), grads)}


def _explicit() -> dict[str, Any]:
    """An MLP under explicit axes: shardings are in the avals, also under ``jit``."""
    def loss(ws: Any, x: jax.Array, out_sharding: P | None = None) -> jax.Array:
        for w1, w2 in ws:
            h = jnp.tanh(x @ w1)
            x = x + jnp.matmul(h, w2, out_sharding=out_sharding)
        return jnp.sum(x ** 2)

    keys = jax.random.split(jax.random.key(1), 9)
    ws = [(jax.random.normal(keys[2 * i], (32, 128)) / 6,
           jax.random.normal(keys[2 * i + 1], (128, 32)) / 11) for i in range(4)]
    x = jax.random.normal(keys[8], (256, 32))
    full = _plan(loss, ws, x, budget=0.6)
    expected = jax.grad(loss)(ws, x)
    with jax.set_mesh(_mesh(explicit=True)):
        sharded_ws = [(jax.device_put(a, P(None, "model")), jax.device_put(b, P("model", None)))
                      for a, b in ws]
        sharded_x = jax.device_put(x, P("data", None))
        step = functools.partial(loss, out_sharding=P("data", None))
        sharded = _plan(step, sharded_ws, sharded_x, budget=0.6)
        planned = jax.jit(jax.grad(sharded.apply(step)))(sharded_ws, sharded_x)
        optimized = jax.jit(jax.grad(autoremat.optimize(step, budget=sharded.budget_bytes)))(
            sharded_ws, sharded_x)
    return {"full": _figures(full), "sharded": _figures(sharded),
            "grad_error": _max_error(expected, planned),
            "optimize_grad_error": _max_error(expected, optimized)}


def _shard_map() -> dict[str, Any]:
    """Layers in ``shard_map`` with a ``psum``: the body is planned per device."""
    mesh = _mesh()
    specs = (P(None, "model"), P("model", None), P("data", None))

    def layer(w1: jax.Array, w2: jax.Array, x: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ w1)
        return jnp.tanh(jax.lax.psum(h @ w2, "model"))

    def loss(w1: jax.Array, w2: jax.Array, x: jax.Array) -> jax.Array:
        for _ in range(4):
            x = jax.shard_map(layer, mesh=mesh, in_specs=specs, out_specs=P("data", None))(
                w1, w2, x)
        return jnp.sum(x ** 2)

    keys = jax.random.split(jax.random.key(2), 3)
    args = (jax.random.normal(keys[0], (32, 128)) / 6,
            jax.random.normal(keys[1], (128, 32)) / 11, jax.random.normal(keys[2], (256, 32)))
    plan = _plan(loss, *args)
    collectives = [v for v in plan.graph.values if v.primitive == "psum_invariant"]
    return {"plan": _figures(plan), "saved_bytes": plan.saved_bytes,
            "actual_saved_bytes": _per_device_residual_bytes(plan.apply(loss), args),
            "body_values": sum(v.primitive == "dot_general" for v in plan.graph.values),
            "collectives": len(collectives),
            "collective_flops": min(v.flops for v in collectives),
            "grad_error": _max_error(jax.grad(loss, (0, 1, 2))(*args),
                                     jax.jit(jax.grad(plan.apply(loss), (0, 1, 2)))(*args))}


# No-op markers JAX may put between a value and the residual that keeps it.
_MARKERS = ("name", "reduce_precision", "optimization_barrier")


def _per_device_residual_bytes(fn: Any, args: tuple) -> int:
    """Bytes of residuals ``fn``'s VJP keeps on one device, arguments excluded: a
    ``shard_map``'s outputs (residuals, or values named after it) are split as its
    ``out_specs`` say."""
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(fn, *a)[1])(*args).jaxpr
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    total = 0
    for var in jaxpr.outvars:
        if var in jaxpr.invars or not hasattr(var, "aval"):
            continue
        size = int(np.prod(var.aval.shape)) * var.aval.dtype.itemsize
        while var in producer and producer[var].primitive.name in _MARKERS:
            var = producer[var].invars[0]
        eqn = producer.get(var)
        if eqn is not None and eqn.primitive.name == "shard_map":
            spec = eqn.params["out_specs"][eqn.outvars.index(var)]
            mesh = eqn.params["mesh"]
            axes = [a for entry in spec if entry is not None
                    for a in ((entry,) if isinstance(entry, str) else entry)]
            size //= int(np.prod([mesh.shape[a] for a in axes]))
        total += size
    return total


def digest(plan: autoremat.Plan) -> str:
    """A digest of a plan's decisions: saved ids, cuts and predicted peak."""
    text = json.dumps([sorted(plan.saved), list(plan.placement.cuts), plan.peak_bytes])
    return hashlib.sha256(text.encode()).hexdigest()


def _digest() -> dict[str, Any]:
    """The data- and tensor-parallel GPT-2 step, planned from shapes alone."""
    model = zoo.get("gpt2-small-tiny")
    mesh = _mesh()
    params = model.param_shapes()
    specs = _specs(params, "tp")
    params = jax.tree.map(lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                            sharding=NamedSharding(mesh, p)),
                          params, specs)
    batch = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                        sharding=NamedSharding(mesh, P("data"))),
                         model.batch_shapes())
    plan = _plan(model.make_loss(), params, batch)
    return {"digest": digest(plan), "processes": jax.process_count(),
            "devices": jax.device_count(), "peak": plan.peak_bytes}


def main(argv: list[str]) -> None:
    if argv[0] == "digest":
        if len(argv) > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(coordinator_address=f"127.0.0.1:{argv[1]}",
                                       num_processes=2, process_id=int(argv[2]),
                                       initialization_timeout=120)
        print(json.dumps(_digest()))
        if len(argv) > 1:
            jax.distributed.shutdown()
        return
    print(json.dumps({"tp": _gpt2("tp"), "fsdp": _gpt2("fsdp"), "explicit": _explicit(),
                      "shard_map": _shard_map(), "digest": _digest()}))


if __name__ == "__main__":
    main(sys.argv[1:])
