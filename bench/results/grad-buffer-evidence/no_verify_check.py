"""Plan a zoo model without verify at each budget (bytes, or "floor") and compile the
plan for TPU v5e ahead of time here (the same peaks as the chip's compile: GPT-2-small's
no remat 5249737728 bytes here and on the TPU host). Usage: no_verify_check.py MODEL BUDGET..."""
import sys
import time

import autoremat
from autoremat import _measure, zoo

name = sys.argv[1]
m = zoo.get(name)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
for b in sys.argv[2:]:
    budget = b if b == "floor" else int(b)
    p = autoremat.plan(loss, *args, budget=budget, layout="tiled", verify=None)
    t = time.perf_counter()
    r = autoremat.measure_step(p.apply(loss), *args, target="tpu-v5e", argnums=_measure.float_argnums(args))
    MiB = 2**20
    print(f"{name} budget {b}: plan no_remat={p.no_remat} overhead {p.modeled_overhead:.4f} regions {len(p.graph.regions)} model {p.peak_bytes/MiB:.1f} MiB compiled {r.peak_bytes/MiB:.1f} MiB ({p.peak_bytes/r.peak_bytes-1:+.1%}) fits {b == 'floor' or r.peak_bytes <= budget} [{time.perf_counter()-t:.0f}s]", flush=True)
