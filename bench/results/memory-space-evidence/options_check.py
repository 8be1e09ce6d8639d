"""Compile a corpus or zoo model's variants for TPU v5e ahead of time under JAX's default
options, with memory-space assignment off, and with the compiler's own remat off; print
each peak and temporary size. Variants: no remat, the hand baseline (every block in its
library's remat with ``nothing_saveable``), and a plan without ``verify`` at each budget
given (MiB, or "floor"). Usage: options_check.py MODEL [BUDGET...]"""
import sys

import jax

import autoremat
from autoremat import _measure, zoo
from bench import corpus

MiB = 2**20
OPTIONS = {"default": {}, "msa_off": {"xla_msa_enable": "false"},
           "remat_off": {"xla_tpu_rematerialization_min_size_in_bytes": "1000000000000000"}}

name = sys.argv[1]
m = corpus.get(name) if name in corpus.CORPUS else zoo.get(name)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
variants = {"none": loss, "hand": m.make_loss(jax.checkpoint_policies.nothing_saveable)}
for b in sys.argv[2:]:
    p = autoremat.plan(loss, *args, budget=b if b == "floor" else int(float(b) * MiB),
                       layout="tiled", verify=None)
    variants[b] = p.apply(loss)
    print(b, "model", p.peak_bytes / MiB)
for k, f in variants.items():
    row = []
    for o, opt in OPTIONS.items():
        r = _measure._compile(f, args, "tpu-v5e", _measure.float_argnums(args), opt)
        row.append(f"{o} {r.peak_bytes / MiB:.1f} (temp {r.temp_bytes / MiB:.1f})")
    print(name, k, " | ".join(row), flush=True)
