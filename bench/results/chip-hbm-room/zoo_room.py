"""On a TPU chip: the least free HBM in which a zoo model's step runs, as written or planned
at a budget (``loop_room.py``'s bisection; on the chip's host ``plan`` verifies by default).

    PYTHONPATH=.:solvers python bench/results/chip-hbm-room/zoo_room.py MODEL:BUDGET ...

BUDGET: bytes, or ``none`` for the function as written. One JSON line per step: the
compiler's figures (MiB), the least room, and the error the step gave one MiB below it.
"""
import json
import sys

import jax
from loop_room import MiB, least_room  # this script's folder is on the path

from autoremat import _measure, zoo
from autoremat._planner._api import plan_with
from autoremat._planner._options import PlanOptions

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
    room, _, error_below = least_room(compiled, args)
    ma = compiled.memory_analysis()
    print(json.dumps({"model": name, "budget": budget, "compiler_peak": ma.peak_memory_in_bytes / MiB,
        "args": ma.argument_size_in_bytes / MiB, "outs": ma.output_size_in_bytes / MiB,
        "temp": ma.temp_size_in_bytes / MiB, "alias": ma.alias_size_in_bytes / MiB,
        "least_room": room, "error_below": error_below}), flush=True)
    jax.clear_caches()
