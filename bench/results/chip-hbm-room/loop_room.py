"""On a TPU chip: the least free HBM in which the step of ``../fidelity-device-memory/scan_gap.py``
runs, looped or unrolled (``chip_room.py``'s bisection; jax alone, no autoremat).

    python loop_room.py V:L:MODE ...      # e.g. 50304:12:scan 50304:12:unroll

One JSON line per program: the compiler's figures (``memory_analysis()``, MiB), the least
room, and the MiB in use beside the step then.
"""
import json
import sys

import jax
import jax.numpy as jnp

MiB = 2**20
B, S, D = 8, 1024, 768

def make(V, L, scan):
    def layer(h, w): return jnp.tanh(h @ w) + h
    def loss(p, x):
        h = p["emb"][x]
        if scan:
            h, _ = jax.lax.scan(lambda h, w: (layer(h, w), None), h, p["w"])
        else:
            for i in range(L): h = layer(h, p["w"][i])
        logits = h @ p["head"]
        return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])
    k = jax.random.split(jax.random.key(0), 3)
    bf16 = jnp.bfloat16
    params = {"emb": jax.random.normal(k[0], (V, D), bf16) / 30, "w": jax.random.normal(k[1], (L, D, D), bf16) / 30,
              "head": jax.random.normal(k[2], (D, V), bf16) / 30}
    ids = jnp.zeros((B, S), jnp.int32)
    return loss, (params, ids)

def least_room(compiled, args):
    """The least free MiB the step runs in, the MiB in use beside it then, and the error
    the step gave one MiB below it."""
    device = jax.devices()[0]
    in_use, errors = {}, {}
    def runs(room):
        stats = device.memory_stats()
        in_use[room] = stats["bytes_in_use"] / MiB
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
    return hi, in_use[hi], errors.get(lo)


def main(specs):
    for spec in specs:
        V, L, mode = spec.split(":")
        loss, args = make(int(V), int(L), mode == "scan")
        compiled = jax.jit(jax.grad(loss)).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        room, in_use, _ = least_room(compiled, args)
        ma = compiled.memory_analysis()
        print(json.dumps({"spec": spec, "compiler_peak": ma.peak_memory_in_bytes / MiB,
            "args": ma.argument_size_in_bytes / MiB, "outs": ma.output_size_in_bytes / MiB,
            "temp": ma.temp_size_in_bytes / MiB, "least_room": room, "in_use": in_use}), flush=True)
        jax.clear_caches()


if __name__ == "__main__":
    main(sys.argv[1:])
