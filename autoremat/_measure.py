"""Real compiler figures for a training step, to check what planning predicts.

:attr:`Plan.peak_bytes` comes from a memory model; the functions here ask an XLA compiler.
TPU targets compile ahead of time with the TPU compiler in ``libtpu`` (``pip install
"autoremat[tpu]"``), on any machine and without a TPU: the step is lowered for one device
of a small TPU topology and compiled with JAX's default options, the compile the user's
``jax.jit`` of the step gets on that chip (on a TPU v5e, the chip's own compile reports the
same peak: ``bench/results/on-chip-tpu-v5e/``). A step sharded over a mesh, by its
arguments or by constraints inside it over this process's devices, is compiled over the
same mesh rebuilt on TPU devices.

The ``"tpu"`` and ``"gpu"`` targets compile for this process's own device, also with
JAX's default options; they are ``verify``'s default on such a machine
(:func:`local_target`).

Process-level caveats of the TPU targets:

* ``libtpu`` reads its settings from the environment once, when it first loads in the
  process. The first TPU measurement sets them with :func:`os.environ.setdefault` (values
  already set win) and they stay set: ``TPU_SKIP_MDS_QUERY=1``,
  ``TPU_WORKER_HOSTNAMES=localhost``, ``TPU_ACCELERATOR_TYPE=v5litepod-4``, and
  ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``, without which a second process that loads ``libtpu``
  while another holds ``/tmp/libtpu_lockfile`` fails (``ABORTED ... lockfile``). On a
  machine with TPUs, initialise JAX (``jax.devices()``) before the first measurement so
  that its TPU backend starts from the host's own settings.
* With ``libtpu`` installed, JAX tries a TPU backend in every process and, on a machine
  without TPUs, logs an error before it falls back to the CPU; the error is harmless.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jax_extend
import numpy as np
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from autoremat._errors import CompilerUnavailableError, UnsupportedProgramError
from autoremat._rewrite import leaf_aval

#: TPU targets and the topology compiled for (one device of it for an unsharded step).
TPU_TOPOLOGIES = {
    "tpu-v4": "v4:2x2x1",
    "tpu-v5e": "v5e:2x2",
    "tpu-v5p": "v5p:2x2x1",
    "tpu-v6e": "v6e:2x2",
}
#: Targets that compile for this process's own device, with JAX's default options.
LOCAL_TARGETS = ("tpu", "gpu")
TARGETS = (*TPU_TOPOLOGIES, *LOCAL_TARGETS)

_TPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v5litepod-4",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
_TPU_INSTALL = 'pip install "autoremat[tpu]"'

# Compiled figures by (lowered program, target, options). The key is the program text,
# so it also tells apart functions whose program depends on JAX settings (remat mode,
# matmul precision) or on state captured in closures.
_cache: dict[tuple[str, str, tuple[tuple[str, str], ...]], Measurement] = {}

#: Set to a directory to keep compiled figures across processes (one JSON file per
#: program, target, options and compiler version); compiles of big steps take minutes.
CACHE_DIR_ENV = "AUTOREMAT_MEASURE_CACHE"
# Bumped when Measurement's fields or their meaning change.
_DISK_FORMAT = 3


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the compiler reports for one compiled training step.

    Attributes:
      target: the target compiled for (see :data:`TARGETS`).
      peak_bytes: the device memory the compiled step holds: its arguments, outputs and
        temporary buffers, a buffer an output shares with an argument counted once. It is
        what budgets are compared with. For a TPU step with a loop (a ``scan``) it is at
        most the compiler's peak: there the temporary buffers the compiler reports
        include some the step never holds at once, and the step runs on the chip in
        the room its compiler peak needs (``bench/results/chip-hbm-room/``).
      compiler_peak_bytes: the compiler's own peak (``peak_memory_in_bytes``). On TPU it
        also counts values that memory-space assignment places in the chip's on-chip
        memory, so it can be tens of MiB above the device memory the step needs, and can
        rank two plans the wrong way (measured on a TPU v5e chip:
        ``bench/results/chip-hbm-room/``).
      temp_bytes: temporaries in device memory (activations, residuals, workspace).
      argument_bytes: the step's arguments.
      output_bytes: the step's outputs (the gradients).
      flops: FLOPs as the compiler counts them. It counts a loop body (a ``scan``) once,
        whatever its length: for scanned programs, count FLOPs from the program instead.
      compile_seconds: time to lower and compile the step, for the compile that produced
        this measurement (repeated measurements of the same program are cached).
      host_temp_bytes: temporaries the compiler placed in host memory (residuals a plan
        offloads, see :class:`autoremat.OffloadConfig`); not part of ``peak_bytes``.

    Example (needs ``pip install "autoremat[tpu]"``):
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> m = autoremat.measure_step(loss, w, x, target="tpu-v5e")
      >>> m.peak_bytes >= m.argument_bytes
      True
    """

    target: str
    peak_bytes: int
    compiler_peak_bytes: int
    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    flops: float
    compile_seconds: float
    host_temp_bytes: int = 0


def measure_step(fn: Callable, *args: Any, target: str = "tpu-v5e",
                 argnums: int | Sequence[int] = 0) -> Measurement:
    """Compiles the training step ``jax.grad(fn, argnums)(*args)`` for ``target``.

    Args:
      fn: the function to differentiate (a loss), for example one made by
        :meth:`Plan.apply`.
      *args: example arguments, arrays or ``jax.ShapeDtypeStruct`` leaves in any pytree;
        only shapes and dtypes are used and nothing is allocated on the target.
      target: one of :data:`TARGETS`.
      argnums: the arguments to differentiate, as for :func:`jax.grad`.

    Returns:
      The compiler's :class:`Measurement`.

    Raises:
      ValueError: ``target`` is unknown.
      CompilerUnavailableError: ``libtpu`` is not installed (TPU targets), or the process
        has no device of a :data:`LOCAL_TARGETS` target.

    Example (needs ``pip install "autoremat[tpu]"``):
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> plan = autoremat.plan(loss, w, x, budget="floor")
      >>> real = autoremat.measure_step(plan.apply(loss), w, x, target="tpu-v5e")
      >>> real.peak_bytes > 0
      True
    """
    return _compile(fn, args, target, argnums, {})


def local_target() -> str | None:
    """The compiler target of this process's accelerator: ``verify``'s default
    (``"auto"``, see :func:`autoremat.plan`).

    Returns:
      ``"gpu"`` on a GPU and ``"tpu"`` on a TPU (:data:`LOCAL_TARGETS`: the device's own
      compile, as the user's ``jax.jit`` runs it); ``None`` on a CPU, where no compiler of
      the step's own device reports its memory.

    Example:
      >>> import jax, autoremat
      >>> autoremat.local_target() is None if jax.default_backend() == "cpu" else True
      True
    """
    backend = jax.default_backend()
    return backend if backend in LOCAL_TARGETS else None


def float_argnums(args: Sequence[Any]) -> tuple[int, ...]:
    """Positions of the arguments whose leaves are all floating-point: those ``jax.grad``
    can differentiate (a batch of images and integer labels is not one of them)."""
    is_float = lambda x: jax.numpy.issubdtype(jax.numpy.result_type(x), jax.numpy.inexact)
    return tuple(k for k, a in enumerate(args)
                 if jax.tree.leaves(a) and all(map(is_float, jax.tree.leaves(a))))


def fits(fn: Callable, *args: Any, budget_bytes: int, target: str = "tpu-v5e",
         argnums: int | Sequence[int] = 0) -> bool:
    """Whether the TPU compiler fits the training step in ``budget_bytes`` of HBM.

    The step is compiled with ``xla_tpu_max_hbm_size_mib`` set to the budget (rounded
    down to whole MiB); the compiler fails with ``RESOURCE_EXHAUSTED`` when the step does
    not fit. Under the limit the compiler also rematerializes on its own where that fits
    the step, as it would on a chip with that much HBM, so a step whose
    :func:`measure_step` peak is over the budget can fit. Its own count differs from
    :attr:`Measurement.peak_bytes` (it adds program overlays, and moves values to on-chip
    memory), so one whose peak is just under the budget may not.

    Args:
      fn, *args, argnums: as for :func:`measure_step`.
      budget_bytes: HBM available to the step, in bytes.
      target: a TPU target (see :data:`TPU_TOPOLOGIES`).

    Returns:
      True when the step compiles within the budget.

    Raises:
      ValueError: ``target`` is not a TPU target, or the budget is below 1 MiB.
      CompilerUnavailableError: ``libtpu`` is not installed.

    Example (needs ``pip install "autoremat[tpu]"``):
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> autoremat.fits(loss, w, x, budget_bytes=64 * 2**20, target="tpu-v5e")
      True
    """
    if target not in TPU_TOPOLOGIES:
        raise ValueError(f"fits needs a TPU target, one of {sorted(TPU_TOPOLOGIES)}; "
                         f"got {target!r}")
    if budget_bytes < 2**20:
        raise ValueError(f"budget_bytes {budget_bytes} is below 1 MiB")
    try:
        _compile(fn, args, target, argnums, {"xla_tpu_max_hbm_size_mib": str(budget_bytes >> 20)})
    except jax.errors.JaxRuntimeError as e:
        if str(e).startswith("RESOURCE_EXHAUSTED"):
            return False
        raise
    return True


def _has_loop(stablehlo: str) -> bool:
    """Whether a lowered program (StableHLO text) runs a loop."""
    return "stablehlo.while" in stablehlo


def _compile(fn: Callable, args: tuple, target: str, argnums: int | Sequence[int],
             options: dict[str, str]) -> Measurement:
    start = time.perf_counter()
    device = _device(target)
    # Weak types kept, as for the plan (autoremat._rewrite.leaf_aval): the same program.
    avals = jax.tree.map(leaf_aval, args)
    lowered = _lower(jax.grad(fn, argnums), avals, target, device)
    text = lowered.as_text()
    key = (hashlib.sha256(text.encode()).hexdigest(), target,
           tuple(sorted(options.items())))
    if key in _cache:
        return _cache[key]
    path = _disk_path(key)
    if path is not None and path.exists():
        _cache[key] = Measurement(**json.loads(path.read_text()))
        return _cache[key]
    compiler_options: dict[str, str | bool] = {**options}
    compiled = lowered.compile(compiler_options=compiler_options or None)
    memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
    assert memory is not None and cost is not None  # the TPU and GPU compilers report both
    held = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
               + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    if target in TPU_TOPOLOGIES and _has_loop(text):
        held = min(held, int(memory.peak_memory_in_bytes))
    _cache[key] = Measurement(
        target=target,
        peak_bytes=held,
        compiler_peak_bytes=int(memory.peak_memory_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        flops=float(cost.get("flops", float("nan"))),
        compile_seconds=time.perf_counter() - start,
        host_temp_bytes=int(getattr(memory, "host_temp_size_in_bytes", 0)))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(_cache[key])))
    return _cache[key]


def _lower(step: Callable, avals: Any, target: str,
           device: jax.Device,  # pyright: ignore[reportInvalidTypeForm]
           ) -> jax.stages.Lowered:
    """``step`` lowered for ``target`` at ``avals``: on ``device``, or over the target's
    counterpart (:func:`_target_mesh`) of the mesh the step is sharded over. That mesh is
    the one of its arguments' shardings and of the concrete meshes inside the program
    (``with_sharding_constraint`` or ``reshard`` over this process's devices, as
    MaxText's models build them), which are replaced by the counterpart."""
    arg_meshes = {a.sharding.mesh for a in jax.tree.leaves(avals)
                  if isinstance(a.sharding, NamedSharding)}
    mesh = _target_mesh(arg_meshes, target, device)
    traced = jax.jit(step).trace(*_place(avals, device, mesh))
    inside = _concrete_meshes(traced.jaxpr) - {mesh}
    try:
        if not inside:
            return traced.lower()
        mesh = _target_mesh(arg_meshes | inside, target, device)
        assert mesh is not None  # the program has a mesh
        jaxpr = _replace_meshes(traced.jaxpr, mesh)
        flat = jax.tree.leaves(_place(avals, device, mesh))
        return jax.jit(jax_extend.core.jaxpr_as_fun(jaxpr)).lower(*flat)
    except ValueError as e:
        if "incompatible devices" not in str(e):
            raise
        raise UnsupportedProgramError(
            f"the step names devices of this process that autoremat cannot map to target "
            f"{target!r} ({str(e).splitlines()[0]}). Build its shardings as NamedSharding over "
            "a jax.sharding.Mesh (compiled over the target's devices) or over a "
            "jax.sharding.AbstractMesh.") from None


def _place(avals: Any, device: jax.Device,  # pyright: ignore[reportInvalidTypeForm]
           mesh: jax.sharding.Mesh | None) -> Any:
    """``avals`` placed on ``device``, or on ``mesh`` when the step is sharded: with their
    own partition specs, unsharded ones replicated."""
    def place(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        sharding = (SingleDeviceSharding(device) if mesh is None else NamedSharding(
            mesh, x.sharding.spec if isinstance(x.sharding, NamedSharding) else PartitionSpec()))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type, sharding=sharding)
    return jax.tree.map(place, avals)


def _target_mesh(meshes: set[jax.sharding.Mesh | jax.sharding.AbstractMesh], target: str,
                 device: jax.Device,  # pyright: ignore[reportInvalidTypeForm]
                 ) -> jax.sharding.Mesh | None:
    """The mesh over ``target``'s devices (:func:`_chips`) with the axis names, sizes and
    types of ``meshes``, which must all agree; ``None`` when there are none."""
    shapes = {(m.axis_names, m.axis_sizes, m.axis_types) for m in meshes}
    if len(shapes) > 1:
        raise UnsupportedProgramError(
            f"the step is sharded over meshes of different shapes: "
            f"{sorted(map(str, meshes))}. autoremat compiles a sharded step over one mesh: "
            "build its arguments' and constraints' shardings over the same axis names and sizes.")
    if not shapes:
        return None
    ((names, sizes, types),) = shapes
    chips = _chips(target, device, int(np.prod(sizes)))
    return jax.sharding.Mesh(np.array(chips).reshape(sizes), names, axis_types=types)


def _chips(target: str, device: jax.Device,  # pyright: ignore[reportInvalidTypeForm]
           n: int) -> list[jax.Device]:  # pyright: ignore[reportInvalidTypeForm]
    """``n`` devices of ``target`` for a mesh of ``n``: ``device`` for one; the first ``n``
    of the target's TPU topology (:data:`TPU_TOPOLOGIES`) when it has as many; else those
    of a topology of ``n`` chips (:func:`sharded_topology`)."""
    if n == 1:
        return [device]
    if target in LOCAL_TARGETS:
        if n > len(jax.devices(target)):
            raise UnsupportedProgramError(
                f"the step is sharded over {n} devices and this process has "
                f"{len(jax.devices(target))} of target {target!r}: measure it on a TPU "
                f"target compiled ahead of time, one of {sorted(TPU_TOPOLOGIES)}")
        return jax.devices(target)[:n]
    chips = topologies.get_topology_desc(topology_name=TPU_TOPOLOGIES[target],
                                         platform="tpu").devices
    if n > len(chips):
        chips = topologies.get_topology_desc(topology_name=sharded_topology(target, n),
                                             platform="tpu").devices
    return list(chips[:n])


def _concrete_meshes(jaxpr: jax_extend.core.ClosedJaxpr) -> set[jax.sharding.Mesh]:
    """The meshes with devices in ``jaxpr``'s parameters (alone or in a NamedSharding),
    those of the jaxprs inside it included."""
    found: set[jax.sharding.Mesh] = set()
    _map_meshes(jaxpr, lambda m: found.add(m) or m)
    return found


def _replace_meshes(jaxpr: jax_extend.core.ClosedJaxpr,
                    mesh: jax.sharding.Mesh) -> jax_extend.core.ClosedJaxpr:
    """``jaxpr`` with each mesh of :func:`_concrete_meshes` replaced by ``mesh``."""
    return _map_meshes(jaxpr, lambda _: mesh)


def _map_meshes(value: Any, f: Callable[[jax.sharding.Mesh], jax.sharding.Mesh]) -> Any:
    """``value`` (a jaxpr, or a parameter of one of its equations) with each mesh with
    devices ``m`` in it, alone or in a NamedSharding, replaced by ``f(m)``."""
    if isinstance(value, jax_extend.core.ClosedJaxpr):
        return value.replace(jaxpr=_map_meshes(value.jaxpr, f))
    if isinstance(value, jax_extend.core.Jaxpr):
        return value.replace(eqns=[
            e.replace(params={k: _map_meshes(v, f) for k, v in e.params.items()})
            for e in value.eqns])
    if type(value) in (tuple, list):
        return type(value)(_map_meshes(v, f) for v in value)
    if isinstance(value, jax.sharding.Mesh) and not value.empty:
        return f(value)
    if isinstance(value, NamedSharding) and isinstance(value.mesh, jax.sharding.Mesh):
        return NamedSharding(_map_meshes(value.mesh, f), value.spec,
                             memory_kind=value.memory_kind)
    return value


def sharded_topology(target: str, chips: int) -> str:
    """The TPU topology of ``chips`` chips (a power of two, at least 4) of ``target``'s
    generation: ``"v5e:2x4"`` for 8 chips of ``"tpu-v5e"``, ``"v4:2x2x2"`` for 8 of
    ``"tpu-v4"``."""
    if chips < 4 or chips & (chips - 1):
        raise UnsupportedProgramError(
            f"autoremat compiles meshes of 1 to 4 devices, or of 8, 16, 32, ..., for {target!r}; "
            f"the step's mesh has {chips}. Shard the step over such a mesh (the compiler's "
            "figures are per device).")
    generation, shape = TPU_TOPOLOGIES[target].split(":")
    dims = [1] * len(shape.split("x"))
    for k in range(chips.bit_length() - 1):
        dims[k % len(dims)] *= 2
    return f"{generation}:{'x'.join(map(str, sorted(dims, key=lambda d: (d == 1, d))))}"


def _disk_path(key: tuple[str, str, tuple[tuple[str, str], ...]]) -> pathlib.Path | None:
    root = os.environ.get(CACHE_DIR_ENV)
    if not root:
        return None
    compiler = importlib.metadata.version("libtpu") if key[1].startswith("tpu") else ""
    if key[1] in LOCAL_TARGETS:
        compiler += jax.devices(key[1])[0].device_kind
    version = (compiler, jax.__version__, _DISK_FORMAT)
    digest = hashlib.sha256(repr((key, *version)).encode()).hexdigest()
    return pathlib.Path(root) / f"{digest}.json"


def _device(target: str) -> jax.Device:  # pyright: ignore[reportInvalidTypeForm]
    """The device to compile for."""
    if target in LOCAL_TARGETS:
        try:
            return jax.devices(target)[0]
        except RuntimeError:
            setup = ('a GPU and jax[cuda12] installed (pip install "jax[cuda12]==0.10.2")'
                     if target == "gpu" else 'a TPU and jax[tpu] installed')
            raise CompilerUnavailableError(
                f"target {target!r} compiles for this process's {target.upper()}, and JAX "
                f"finds none. Run on a machine with {setup}, or compile ahead of time for a "
                f"TPU target (tpu-v5e, ...) without a TPU: {_TPU_INSTALL}") from None
    if target not in TPU_TOPOLOGIES:
        raise ValueError(f"unknown target {target!r}; expected one of {list(TARGETS)}")
    if importlib.util.find_spec("libtpu") is None and "TPU_LIBRARY_PATH" not in os.environ:
        raise CompilerUnavailableError(
            f"target {target!r} needs the TPU compiler (libtpu), which is not installed: "
            f"{_TPU_INSTALL}")
    for name, value in _TPU_ENV.items():
        os.environ.setdefault(name, value)
    topology = topologies.get_topology_desc(topology_name=TPU_TOPOLOGIES[target], platform="tpu")
    return topology.devices[0]
