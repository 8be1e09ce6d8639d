"""Ahead of time for TPU v5e: the least HBM limit (``xla_tpu_max_hbm_size_mib``, 2 MiB
steps) under which a variant compiles, beside its default compile's peak.

``python aot_hbm_limit.py MODEL on|off VARIANT...`` (``off``: the compiler's own remat off, so
it cannot recompute to fit); VARIANT ``floor`` (the first floor contender), ``hand`` or
``none``. Slow: several compiles of a minute each.
"""
import sys

import jax

from autoremat import _measure, _rewrite
from autoremat._planner import _api
from autoremat._planner._candidates import candidates
from autoremat._planner._options import PlanOptions
from bench import corpus

name, remat = sys.argv[1], sys.argv[2]  # remat: on|off
m = corpus.get(name)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
an = _measure.float_argnums(args)
opts = PlanOptions(verify="tpu-v5e")
flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
found = candidates(flat_fn, avals, opts)
cont = _api._floor_contenders(found, opts)
fns = {"floor": cont[0].apply(loss), "hand": m.make_loss(jax.checkpoint_policies.nothing_saveable), "none": loss}
extra = {} if remat == "on" else {"xla_tpu_rematerialization_min_size_in_bytes": "1000000000000000"}
for k in sys.argv[3:]:
    f = fns[k]
    base = _measure._compile(f, args, "tpu-v5e", an, extra)
    lo, hi = 60, int(base.peak_bytes / 2**20) + 2   # lo fails (assumed), hi fits
    while hi - lo > 2:
        mid = (lo + hi) // 2
        try:
            r = _measure._compile(f, args, "tpu-v5e", an, {**extra, "xla_tpu_max_hbm_size_mib": str(mid)})
            hi = mid; print(k, mid, "fits, peak", r.peak_bytes / 2**20, "flops", r.flops, flush=True)
        except jax.errors.JaxRuntimeError as e:
            if not str(e).startswith("RESOURCE_EXHAUSTED"): raise
            lo = mid; print(k, mid, "no", flush=True)
    print(f"{name} {k} remat={remat}: default peak {base.peak_bytes/2**20:.1f} flops {base.flops:.4g}; least HBM limit that compiles in ({lo}, {hi}] MiB", flush=True)
