"""On a TPU chip: the least free HBM in which each variant's step runs, found by filling
the rest of the chip's memory with one array and bisecting its size (1 MiB steps).

``python chip_room.py MODEL:VARIANT,VARIANT... ...`` (from the repository root,
``PYTHONPATH=.:solvers``; one process for all, since each process that opens the chip
costs seconds), VARIANT one of ``none`` (no remat), ``hand`` (the model's own remat per block,
``nothing_saveable``), ``verified`` (the verified floor, ``budget="floor"`` verified on this
chip), or an index into the verified floor's contenders
(``autoremat._planner._api._floor_contenders``; 0 is the model's floor plan). One JSON line
per variant: the compiler's figures (``memory_analysis()``), the bytes in use when the
least room was found (the arguments and the loaded executables) and that room.
"""

import json
import sys

import jax
import jax.numpy as jnp

import autoremat
from autoremat import _measure, _rewrite, zoo
from autoremat._planner import _api
from autoremat._planner._candidates import candidates
from autoremat._planner._options import PlanOptions
from bench import corpus

MiB = 2**20


def variants(name: str, wanted: list[str]) -> tuple[dict, tuple]:
    m = corpus.get(name) if name in corpus.CORPUS else zoo.get(name)
    loss = m.make_loss()
    args = m.init(jax.random.key(0))
    fns = {"none": loss, "hand": m.make_loss(jax.checkpoint_policies.nothing_saveable)}
    if "verified" in wanted:
        fns["verified"] = autoremat.plan(loss, *args, budget="floor", verify="tpu").apply(loss)
    if any(k.isdigit() for k in wanted):
        opts = PlanOptions(verify="tpu-v5e")
        shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
        flat_fn, _, avals, _ = _rewrite.flat_function(loss, shapes, {})
        contenders = _api._floor_contenders(candidates(flat_fn, avals, opts), opts)
        fns |= {k: contenders[int(k)].apply(loss) for k in wanted if k.isdigit()}
    return {k: fns[k] for k in wanted}, args


def least_room(compiled, args) -> tuple[int, float]:
    """The least free MiB the step runs in, and the MiB in use beside it then."""
    device = jax.devices()[0]
    in_use = {}

    def runs(room: int) -> bool:
        stats = device.memory_stats()
        in_use[room] = stats["bytes_in_use"] / MiB
        fill = max(stats["bytes_limit"] - stats["bytes_in_use"] - room * MiB, 0)
        filler = jax.block_until_ready(jnp.zeros((fill // 4,), jnp.float32))
        try:
            jax.block_until_ready(compiled(*args))
            return True
        except (jax.errors.JaxRuntimeError, ValueError) as e:  # loading it, or running
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return False
        finally:
            del filler

    lo, hi = 0, int(compiled.memory_analysis().peak_memory_in_bytes / MiB) + 64
    assert runs(hi), "the step does not run with its compiler peak free"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if runs(mid) else (mid, hi)
    return hi, in_use[hi]


def main(name: str, wanted: list[str]) -> None:
    fns, args = variants(name, wanted)
    argnums = _measure.float_argnums(args)
    for k, fn in fns.items():
        compiled = jax.jit(jax.grad(fn, argnums)).lower(*args).compile()
        jax.block_until_ready(compiled(*args))  # its executable loaded
        room, in_use = least_room(compiled, args)
        ma = compiled.memory_analysis()
        print(json.dumps({
            "model": name, "variant": k, "compiler_peak": ma.peak_memory_in_bytes / MiB,
            "args": ma.argument_size_in_bytes / MiB, "outs": ma.output_size_in_bytes / MiB,
            "temp": ma.temp_size_in_bytes / MiB, "code": ma.generated_code_size_in_bytes / MiB,
            "args_outs_temp": (ma.argument_size_in_bytes + ma.output_size_in_bytes
                               + ma.temp_size_in_bytes - ma.alias_size_in_bytes) / MiB,
            "in_use_at_least": in_use, "least_room": room, "need": in_use + room}), flush=True)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        name, wanted = spec.split(":")
        main(name, wanted.split(","))
        jax.clear_caches()  # the executables' code off the chip before the next model's
