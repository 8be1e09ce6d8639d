"""Sharded programs: per-device sizes, collectives' costs, identical plans in every process.

Checks that run sharded steps need several devices, which the XLA CPU backend only makes
when ``XLA_FLAGS`` is set before JAX starts: they run ``tests/sharding_job.py`` in
subprocesses. The rest plan on abstract meshes in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax._src import core as jax_core
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import autoremat
from autoremat import _cost, _measure, _sharding

_JOB = pathlib.Path(__file__).with_name("sharding_job.py")
_ROOT = _JOB.parent.parent
_MESH = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def _sds(shape, spec=None, dtype=jnp.float32):
    sharding = None if spec is None else NamedSharding(_MESH, spec)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _sizes(plan):
    """Per-device bytes by producing primitive, in program order."""
    return [(v.primitive, v.nbytes) for v in plan.graph.values]


def test_sizes_follow_argument_shardings_and_constraints():
    def f(w, x):
        h = jnp.tanh(x @ w)  # [8@data, 32@model]
        return jnp.sum(jax.lax.with_sharding_constraint(h, P("data", None)) ** 2)

    with jax.sharding.use_abstract_mesh(_MESH):
        plan = autoremat.plan(f, _sds((16, 32), P(None, "model")), _sds((8, 16), P("data")),
                              budget=1.0)
    full = 8 * 32 * 4
    assert _sizes(plan)[:3] == [("dot_general", full // 8), ("tanh", full // 8),
                                ("sharding_constraint", full // 2)]
    assert plan.graph.arg_bytes == 16 * 32 * 4 // 4 + 8 * 16 * 4 // 2


def test_unknown_sharding_takes_the_constraint_that_follows():
    def f(x):
        y = jnp.tanh(x) * 2.0  # x has no sharding: y's is a guess
        return jnp.sum(jax.lax.with_sharding_constraint(y, P("data", "model")))

    with jax.sharding.use_abstract_mesh(_MESH):
        plan = autoremat.plan(f, _sds((8, 16)), budget=1.0)
    assert plan.graph.arg_bytes == 8 * 16 * 4  # arguments without a sharding: full size
    assert [b for p, b in _sizes(plan) if p in ("tanh", "mul")] == [8 * 16 * 4 // 8] * 2


def test_jit_in_shardings_shard_arguments():
    mesh_sharding = NamedSharding(_MESH, P("data"))
    step = jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2), in_shardings=mesh_sharding)
    with jax.sharding.use_abstract_mesh(_MESH):
        plan = autoremat.plan(step, _sds((8, 16)), budget=1.0)
    assert plan.graph.arg_bytes == 8 * 16 * 4 // 2
    assert dict(_sizes(plan))["sin"] == 8 * 16 * 4 // 2


def test_unsharded_programs_are_unchanged():
    plan = autoremat.plan(lambda x: jnp.sum(jnp.sin(x) ** 2), jnp.ones((8, 16)), budget=1.0)
    assert dict(_sizes(plan))["sin"] == 8 * 16 * 4
    assert plan.graph.arg_bytes == 8 * 16 * 4


@pytest.mark.parametrize("shape, spec, new, expected", [
    ((2, 32, 192), (("d",), (), ("m",)), (2, 32, 4, 48), (("d",), (), ("m",), ())),
    ((2, 32, 192), (("d",), (), ("m",)), (2, 32, 3, 4, 16), (("d",), (), (), ("m",), ())),
    ((2, 32, 192), (("d",), (), ("m",)), (2, 32, 3, 64), (("d",), (), (), ("m",))),
    ((2, 30), ((), ("m",)), (2, 3, 10), ((), (), ())),
    ((2, 32, 64), (("d",), (), ()), (64, 64), (("d",), ())),
    ((2, 1, 32), ((), (), ("m",)), (2, 32), ((), ("m",))),
])
def test_reshape_keeps_the_major_dimensions_split(shape, spec, new, expected):
    assert _sharding._reshape(spec, shape, new, {"d": 2, "m": 4}) == expected


def test_collectives_cost_their_bytes():
    aval = jax_core.ShapedArray((4, 16), jnp.float32)
    gathered = jax_core.ShapedArray((16, 16), jnp.float32)
    per_byte = _cost.FLOPS_PER_COMM_BYTE
    assert _cost.eqn_flops("psum", {"axes": ("m",)}, [aval], [aval]) == 2 * 256 * per_byte
    assert _cost.eqn_flops("all_gather", {}, [aval], [gathered]) == 1024 * per_byte
    assert _cost.eqn_flops("reduce_scatter", {}, [gathered], [aval]) == 1024 * per_byte
    assert _cost.eqn_flops("ppermute", {}, [aval], [aval]) == 256 * per_byte
    assert not _cost.fusible("psum") and not _cost.fuses_cotangent("all_gather")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason='the TPU compiler is not installed: pip install "autoremat[tpu]"')
def test_sharded_steps_compile_per_device_for_a_tpu_topology():
    """A step sharded over an 8-device mesh compiles for ``v5e:2x4``: per-device figures."""
    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    w, x = _sds((256, 512), P(None, "model")), _sds((64, 256), P("data"))
    measured = autoremat.measure_step(f, w, x, target="tpu-v5e")
    assert measured.argument_bytes == 256 * 512 * 4 // 4 + 64 * 256 * 4 // 2
    assert measured.output_bytes == 256 * 512 * 4 // 4
    assert _measure.sharded_topology("tpu-v5e", 8) == "v5e:2x4"
    assert _measure.sharded_topology("tpu-v4", 4) == "v4:2x2x1"


def _run(args, devices):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, str(_JOB), *args], env=env, cwd=_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checks():
    """The figures of ``sharding_job.py checks`` on 8 CPU devices."""
    return _result(_run(["checks"], devices=8))


@pytest.mark.parametrize("style", ["tp", "fsdp"])
def test_gpt2_data_tensor_and_fsdp_parallel(checks, style):
    """GPT-2 tiny on a 2x4 ('data', 'model') mesh: batch over 'data' with weights over
    'model' (tp) or every parameter's first axis over all 8 devices (fsdp)."""
    found = checks[style]
    assert found["grad_error"] < 1e-5
    assert found["each_value_smaller_or_equal"]
    full, sharded = found["full"], found["sharded"]
    # Activations split over 'data' (2) and, with tp, some over 'model' (4) too.
    assert sharded["value_bytes"] < full["value_bytes"] / (3.5 if style == "tp" else 1.9)
    assert sharded["arg_bytes"] < full["arg_bytes"] / (3 if style == "tp" else 7)
    assert sharded["peak"] < full["peak"] / 2.5
    assert sharded["peak"] <= sharded["budget"]
    assert sharded["step_flops"] < full["step_flops"]


def test_explicit_axes(checks):
    found = checks["explicit"]
    assert found["grad_error"] < 1e-5 and found["optimize_grad_error"] < 1e-5
    assert found["sharded"]["value_bytes"] < found["full"]["value_bytes"] / 4
    assert found["sharded"]["peak"] <= found["sharded"]["budget"]


def test_shard_map_bodies_are_planned_per_device(checks):
    found = checks["shard_map"]
    assert found["grad_error"] < 1e-5
    assert found["body_values"] == 8  # both dots of each of 4 layers are planned values
    assert found["saved_bytes"] == found["actual_saved_bytes"]
    assert found["collectives"] == 4 and found["collective_flops"] > 0


def test_every_process_reaches_the_same_plan(checks):
    """Two processes of one ``jax.distributed`` job (4 CPU devices each) plan the sharded
    GPT-2 step from shapes: the same plan, and the same as one process with 8 devices."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [_run(["digest", port, str(k)], devices=4) for k in range(2)]
    found = [_result(p) for p in procs]
    assert [f["processes"] for f in found] == [2, 2]
    assert [f["devices"] for f in found] == [8, 8]
    assert found[0]["digest"] == found[1]["digest"] == checks["digest"]["digest"]
    assert found[0]["peak"] == checks["tp"]["sharded"]["peak"]
