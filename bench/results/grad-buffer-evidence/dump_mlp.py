"""Compile the zoo's mlp for TPU v5e with an XLA dump; keep its memory-usage report.
Usage: dump_mlp.py VARIANT OUT, VARIANT "none" (no remat) or a budget in bytes (the plan
without verify). Run on the TPU v5e host."""
import os
import pathlib
import shutil
import sys

variant, out = sys.argv[1], pathlib.Path(sys.argv[2])
dump = pathlib.Path("/tmp/dump-" + variant)
shutil.rmtree(dump, ignore_errors=True)
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
import collections

import autoremat
from autoremat import _measure, zoo

m = zoo.get("mlp")
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
fn = loss
if variant != "none":
    p = autoremat.plan(loss, *args, budget=int(variant), layout="tiled", verify=None)
    print("predicted", p.peak_bytes, "overhead", p.modeled_overhead, "regions", len(p.placement.cuts) + 1)
    sizes = lambda ids: sorted(collections.Counter(v.nbytes for v in p.graph.values if v.id in ids).items(), reverse=True)
    print("saved sizes", sizes(p.saved))
    print("recomputed sizes", sizes(p.recomputed))
    fn = p.apply(loss)
_measure._cache.clear()
os.environ.pop("AUTOREMAT_MEASURE_CACHE", None)
r = autoremat.measure_step(fn, *args, target="tpu-v5e", argnums=_measure.float_argnums(args))
print(variant, "real peak", r.peak_bytes, "temp", r.temp_bytes, "args", r.argument_bytes, "out", r.output_bytes)
out.mkdir(parents=True, exist_ok=True)
for f in sorted(dump.glob("module_0000.*memory-usage-report.txt")):
    shutil.copy(f, out / f"{variant}-{f.name}")
