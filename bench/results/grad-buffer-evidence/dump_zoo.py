"""Compile a zoo model's plan without verify for TPU v5e with an XLA dump; keep the
compiler's buffer assignment and memory-usage report. Usage: dump_zoo.py MODEL BUDGET OUT
(BUDGET "floor" or bytes). Run on the TPU v5e host."""
import os
import pathlib
import shutil
import sys

model, budget, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
dump = pathlib.Path("/tmp/dump-" + model)
shutil.rmtree(dump, ignore_errors=True)
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
import collections

import autoremat
from autoremat import _measure, zoo

m = zoo.get(model)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
p = autoremat.plan(loss, *args, budget=budget if budget == "floor" else int(budget), layout="tiled", verify=None)
print("predicted", p.peak_bytes, "overhead", p.modeled_overhead)
print("grad buffers", sorted(collections.Counter(p.graph.grad_buffers).items(), reverse=True)[:6])
print("saved", sorted(collections.Counter(v.nbytes for v in p.graph.values if v.id in p.saved).items(), reverse=True)[:10])
fn = p.apply(loss)
_measure._cache.clear()
os.environ.pop("AUTOREMAT_MEASURE_CACHE", None)
r = autoremat.measure_step(fn, *args, target="tpu-v5e", argnums=_measure.float_argnums(args))
print("real peak", r.peak_bytes, "args", r.argument_bytes, "out", r.output_bytes)
out.mkdir(parents=True, exist_ok=True)
for f in sorted(dump.glob("module_*")):
    if f.name.endswith("buffer-assignment.txt") or f.name.endswith("memory-usage-report.txt"):
        if os.path.getsize(f) > 100000 or "memory-usage" in f.name:
            shutil.copy(f, out / f.name)
