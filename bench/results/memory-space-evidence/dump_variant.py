"""Compile one variant of a corpus or zoo model for TPU v5e ahead of time with an XLA
dump, and keep the compiler's buffer assignment and memory-usage report.
Usage: dump_variant.py MODEL VARIANT OPTIONS OUT, where VARIANT is "none", "hand", "floor"
or a budget in MiB (a plan without verify) and OPTIONS "default" or "msa_off"."""
import os
import pathlib
import shutil
import sys

model, variant, opt, out = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
dump = pathlib.Path(f"/tmp/dump-{model}-{variant}-{opt}")
shutil.rmtree(dump, ignore_errors=True)
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
os.environ.pop("AUTOREMAT_MEASURE_CACHE", None)
import jax  # noqa: E402

import autoremat  # noqa: E402
from autoremat import _measure, zoo  # noqa: E402
from bench import corpus  # noqa: E402

m = corpus.get(model) if model in corpus.CORPUS else zoo.get(model)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
if variant == "hand":
    fn = m.make_loss(jax.checkpoint_policies.nothing_saveable)
elif variant == "none":
    fn = loss
else:
    budget = variant if variant == "floor" else int(float(variant) * 2**20)
    fn = autoremat.plan(loss, *args, budget=budget, layout="tiled", verify=None).apply(loss)
r = _measure._compile(fn, args, "tpu-v5e", _measure.float_argnums(args),
                      {} if opt == "default" else {"xla_msa_enable": "false"})
print("peak", r.peak_bytes / 2**20, "temp", r.temp_bytes / 2**20)
out.mkdir(parents=True, exist_ok=True)
for f in sorted(dump.glob("module_*")):
    if f.name.endswith(("buffer-assignment.txt", "memory-usage-report.txt")):
        shutil.copy(f, out / f.name)
