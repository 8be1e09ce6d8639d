"""Compile a zoo model's step for TPU v5e with an XLA dump; list allocations by layout.
Usage: dump_step.py MODEL DUMPDIR [BUDGET_BYTES [LAYOUT]]"""
import os
import pathlib
import shutil
import sys

model, dump = sys.argv[1], pathlib.Path(sys.argv[2])
shutil.rmtree(dump, ignore_errors=True)
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
import autoremat
from autoremat import zoo

m = zoo.get(model)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
fn = loss
if len(sys.argv) > 3:
    kw = {"layout": sys.argv[4]} if len(sys.argv) > 4 else {}
    p = autoremat.plan(loss, *args, budget=int(sys.argv[3]), time_limit_s=30, **kw)
    print("predicted", p.peak_bytes / 2**20, "cuts", len(p.placement.cuts) + 1)
    fn = p.apply(loss)
from autoremat import _measure

_measure._cache.clear()
os.environ.pop("AUTOREMAT_MEASURE_CACHE", None)
r = autoremat.measure_step(fn, *args, target="tpu-v5e", argnums=_measure.float_argnums(args))
print("real peak MiB", r.peak_bytes / 2**20, "temp", r.temp_bytes / 2**20, "args", r.argument_bytes / 2**20, "out", r.output_bytes / 2**20)
