"""On a TPU chip: the least free HBM in which a zoo model's step runs, as written or planned
at a budget (``chip_room.py``'s bisection; on the chip's host ``plan`` verifies by default).

    PYTHONPATH=.:solvers python bench/results/chip-hbm-room/zoo_room.py MODEL:BUDGET ...

BUDGET: bytes, or ``none`` for the function as written. One JSON line per step: the
compiler's figures (MiB), the least room, and the error the step gave one MiB below it.
"""
import json
import sys

import jax
import jax.numpy as jnp

from autoremat import _measure, zoo
from autoremat._planner._api import plan_with
from autoremat._planner._options import PlanOptions

MiB = 2**20
errors = {}
def least_room(compiled, args):
    device = jax.devices()[0]
    def runs(room):
        stats = device.memory_stats()
        fill = max(stats["bytes_limit"] - stats["bytes_in_use"] - room * MiB, 0)
        filler = jax.block_until_ready(jnp.zeros((fill // 4,), jnp.float32))
        try:
            jax.block_until_ready(compiled(*args)); return True
        except (jax.errors.JaxRuntimeError, ValueError) as e:
            if "RESOURCE_EXHAUSTED" not in str(e): raise
            errors[room] = str(e)[:400]; return False
        finally:
            del filler
    ma = compiled.memory_analysis()
    lo, hi = 0, int((ma.output_size_in_bytes + ma.temp_size_in_bytes) / MiB) + 160
    assert runs(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if runs(mid) else (mid, hi)
    return hi, lo
for spec_ in sys.argv[1:]:
    name, budget = spec_.split(":")
    m = zoo.get(name)
    loss = m.make_loss()
    args = m.init(jax.random.key(0))
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    fn = loss if budget == "none" else plan_with(loss, shapes, {}, int(budget), PlanOptions(layout="tiled")).apply(loss)
    argnums = _measure.float_argnums(args)
    compiled = jax.jit(jax.grad(fn, argnums)).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    errors.clear()
    room, lo = least_room(compiled, args)
    ma = compiled.memory_analysis()
    print(json.dumps({"model": name, "budget": budget, "compiler_peak": ma.peak_memory_in_bytes / MiB,
        "args": ma.argument_size_in_bytes / MiB, "outs": ma.output_size_in_bytes / MiB,
        "temp": ma.temp_size_in_bytes / MiB, "alias": ma.alias_size_in_bytes / MiB,
        "least_room": room, "error_below": errors.get(lo)}), flush=True)
    jax.clear_caches()
