"""Device memory against the compiler's peak, with the layers under ``lax.scan`` or unrolled.

    PYTHONPATH=.:solvers python bench/results/fidelity-device-memory/scan_gap.py V L MODE

Twelve (``L``) ``tanh(h @ w) + h`` layers on ``bf16[8,1024,768]``, an embedding and a head
of ``V`` classes with a log-softmax loss; ``MODE`` is ``scan`` or ``unroll``. Compiled
ahead of time for TPU v5e; prints MiB.
"""

import sys

import jax
import jax.numpy as jnp

from autoremat import _measure

B, S, D = 8, 1024, 768
V, L, SCAN = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "scan"


def layer(h, w):
    return jnp.tanh(h @ w) + h


def loss(p, x):
    h = p["emb"][x]
    if SCAN:
        h, _ = jax.lax.scan(lambda h, w: (layer(h, w), None), h, p["w"])
    else:
        for i in range(L):
            h = layer(h, p["w"][i])
    logits = h @ p["head"]
    return -jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])


bf16 = jnp.bfloat16
params = {"emb": jax.ShapeDtypeStruct((V, D), bf16), "w": jax.ShapeDtypeStruct((L, D, D), bf16),
          "head": jax.ShapeDtypeStruct((D, V), bf16)}
ids = jax.ShapeDtypeStruct((B, S), jnp.int32)
m = _measure.measure_step(loss, params, ids, target="tpu-v5e")
MIB = 2**20
print(sys.argv[1:], "device", m.peak_bytes / MIB, "cpeak", m.compiler_peak_bytes / MIB,
      "temp", m.temp_bytes / MIB, "args", m.argument_bytes / MIB, "logits", B * S * V * 2 / MIB)
