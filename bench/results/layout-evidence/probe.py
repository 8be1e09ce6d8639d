"""Compile one TPU v5e AOT program with many parameters; print each parameter's layout and allocation size."""
import os
import pathlib
import re
import shutil

dump = pathlib.Path("/tmp/tile-probe/dump"); shutil.rmtree(dump, ignore_errors=True)
os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
for k, v in {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost", "TPU_ACCELERATOR_TYPE": "v5litepod-4", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}.items():
    os.environ.setdefault(k, v)
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding

dev = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
shapes = [(), (1,), (3,), (64,), (128,), (129,), (1000,), (1025,), (2048,), (1, 1), (1, 64), (3, 5), (8, 128), (9, 128), (8, 129), (16, 64), (17, 64),
          (4, 3, 5), (2, 9, 64), (2, 8, 128), (7, 1, 1), (5, 1, 128), (2, 16, 16, 64), (2, 16, 16, 3), (2, 3, 16, 16)]
dtypes = [jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_, jnp.int32, jnp.float16]
avals = [jax.ShapeDtypeStruct(s, d, sharding=SingleDeviceSharding(dev)) for d in dtypes for s in shapes]
def f(*xs):
    return [x for x in xs[:0]] + [jnp.sum(x.astype(jnp.float32)) for x in xs]
c = jax.jit(f).lower(*avals).compile(compiler_options={"xla_msa_enable": "false"})
ba = next(dump.glob("*after_optimizations-buffer-assignment.txt")).read_text()
hlo = next(dump.glob("*after_optimizations.txt")).read_text()
# parameter layouts from entry computation signature
params = {}
for m in re.finditer(r"allocation (\d+): size (\d+), parameter (\d+)", ba):
    params[int(m[3])] = int(m[2])
lay = re.search(r"ENTRY [^\n]*\n((?:.*\n)*?)\s*ROOT", hlo)
playouts = {}
for m in re.finditer(r"(\S+\[[^\]]*\]\{[^}]*\}) parameter\((\d+)\)", hlo):
    playouts[int(m[2])] = m[1]
for i, a in enumerate(avals):
    dense = int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
    print(f"{a.dtype!s:9s} {a.shape!s:16s} dense {dense:7d} alloc {params.get(i)!s:8s} {playouts.get(i, '?')}")
print("argument_size", c.memory_analysis().argument_size_in_bytes)
