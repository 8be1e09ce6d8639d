"""FLOP estimates per equation, recursing into sub-programs (scan-aware).

``dot_general`` costs ``2 * |out| * prod(contracting dims)``, a convolution
``2 * |out| * (kernel elements per output feature)``, elementwise ops and reductions one
FLOP per element, and data movement (reshapes, broadcasts, slices, converts, ``stack``, ``unstack``)
and random keys and bits (``random_bits``, ``random_split``, ``random_fold_in``,
``threefry2x32``: integer hashing) nothing. A
scan costs ``length`` times its body, a ``cond`` its most expensive branch, a
``shard_map`` its body (per-device shapes) times the devices it runs on: FLOPs here are
those of the whole program over all devices. A primitive this table does not know gets a
conservative cost (ten FLOPs per element in and out) and a warning, once per primitive.

Collectives (``psum``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``ppermute``
and the others of :data:`COLLECTIVES`, in ``shard_map`` bodies, and ``reshard`` between
explicit shardings) cost the bytes they move, as FLOP-equivalents: the time the bytes
take over the chip's interconnect, at the chip's peak FLOP rate,
``bytes * FLOPS_PER_COMM_BYTE``. The bytes are an upper bound of what one device sends
in a ring: its larger operand or result (``(n - 1) / n`` of it, rounded up to all of it),
twice for all-reduces. A collective is recomputed when its region is, and communicates
again: this cost keeps the planner from treating that as free.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from jax._src import core as jax_core
from jax._src.ad_checkpoint import CheckpointName
from jax._src.interpreters import partial_eval as pe

_FREE = frozenset([
    "reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "convert_element_type",
    "bitcast_convert_type", "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad",
    "rev", "copy", "gather", "iota", "select_n", "tile", "stop_gradient", "name",
    "reduce_precision", "optimization_barrier", "device_put", "sharding_constraint", "split",
    "real", "imag", "complex", "empty", "zeros_like", "full_like", "pvary", "mesh_cast",
    "random_wrap", "random_unwrap", "random_seed", "random_bits", "random_split", "random_fold_in",
    "threefry2x32", "stack", "unstack", "empty2", "debug_print", "debug_callback"])

_ELEMENTWISE = frozenset([
    "add", "add_any", "sub", "mul", "div", "neg", "abs", "sign", "floor", "ceil", "round", "max",
    "min", "pow", "integer_pow", "square", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "log", "log1p",
    "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh",
    "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erf_inv", "lgamma", "digamma", "is_finite",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "rem", "nextafter", "clamp", "scatter-add",
    "scatter", "scatter_add", "select_and_scatter_add", "population_count", "clz", "conj"])

# Calls whose body is the ``call_jaxpr`` parameter.
_CALLS = frozenset(["custom_jvp_call", "custom_vjp_call", "closed_call", "core_call"])

_REDUCTIONS = frozenset([
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax",
    "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "reduce_xor",
    "reduce_window_max", "reduce_window_min", "reduce_window_sum", "reduce_window",
    "select_and_gather_add"])

#: Collectives and the factor on their bytes (2 for all-reduces: reduce-scatter, then
#: all-gather). ``sharding_constraint`` is left out: what it costs depends on the
#: sharding the compiler picks for its operand, unknown here.
COLLECTIVES = {
    "psum": 2, "psum_invariant": 2, "pmax": 2, "pmin": 2, "unreduced_psum": 2,
    "all_gather": 1, "all_gather_invariant": 1, "all_gather_reduced": 1,
    "reduce_scatter": 1, "unreduced_reduce_scatter": 1, "all_to_all": 1,
    "ragged_all_to_all": 1, "ppermute": 1, "pbroadcast": 1, "reshard": 1,
}

#: FLOPs one byte of communication is worth: TPU v5e's peak bf16 rate (1.97e14 FLOP/s)
#: over its interconnect bandwidth per chip and direction (4.5e10 bytes/s per ICI link;
#: "How to Scale Your Model", jax-ml.github.io/scaling-book, chapter "All About TPUs").
FLOPS_PER_COMM_BYTE = 4400

_warned: set[str] = set()


def fusible(name: str) -> bool:
    """Whether XLA fuses ``name`` into its consumers, so its output need not exist."""
    return name in _FREE or name in _ELEMENTWISE


def fuses(name: str, params: Mapping[str, Any]) -> bool:
    """Whether XLA fuses the output of an equation of primitive ``name`` into its
    consumers: a :func:`fusible` op, or a call of only such ops (``jax.nn.relu`` is a
    ``custom_jvp_call`` of a ``jit`` of ``max``, which XLA inlines and fuses)."""
    if fusible(name):
        return True
    body = _call_body(name, params)
    return body is not None and all(fuses(e.primitive.name, e.params) for e in body.eqns)


def reads_operands_whole(name: str) -> bool:
    """Whether the backward pass of ``name`` reads its operands from memory, so that XLA
    keeps them rather than fusing their elementwise producers into it: true for
    convolutions, whose transposes are convolutions again (measured on TPU v5e: a
    ResNet's and a U-Net's no-remat peaks, within 8%, counting their operands kept)."""
    return name == "conv_general_dilated"


def fuses_cotangent(name: str, params: Mapping[str, Any] | None = None) -> bool:
    """Whether the cotangent ``name``'s transpose sends to its inputs fuses into the
    consumers of that cotangent: true for elementwise and data-movement ops, for
    reductions (whose transposes broadcast), and for calls of only elementwise and
    data-movement ops (``params``: the equation's) but a ``custom_vjp_call``, whose
    backward rule is the user's; false for dots, convolutions, loops and other calls,
    whose transposes materialize their results."""
    return fusible(name) or name in _REDUCTIONS or (
        params is not None and name != "custom_vjp_call" and fuses(name, params))


def _call_body(name: str, params: Mapping[str, Any]) -> Any:
    """The jaxpr a call equation runs (``None``: not a call, or of unknown form)."""
    body = params.get("call_jaxpr") if name in _CALLS else \
        params.get("jaxpr") if name in ("jit", "pjit") else None
    return getattr(body, "jaxpr", body)


def moves_data(name: str) -> bool:
    """Whether ``name`` moves or relayouts data without arithmetic (no FLOPs, but memory
    traffic when recomputed)."""
    return name in _FREE


def comm_bytes(name: str, in_avals: list, out_avals: list) -> int:
    """Bytes collective ``name`` moves (the bound of the module doc); 0 for other ops."""
    factor = COLLECTIVES.get(name, 0)
    if not factor or (name == "reshard" and _spec(in_avals[0]) == _spec(out_avals[0])):
        return 0
    size = lambda avals: sum(_size(a) * _itemsize(a) for a in avals)
    return factor * max(size(in_avals), size(out_avals))


def manual_devices(params: Mapping[str, Any]) -> int:
    """Devices a ``shard_map`` with ``params`` runs its body on (one copy each)."""
    return math.prod(params["mesh"].shape[a] for a in params["newly_manual_axes"])


def _spec(aval: Any) -> Any:
    return getattr(getattr(aval, "sharding", None), "spec", None)


def _itemsize(aval: Any) -> int:
    dtype = getattr(aval, "dtype", None)
    return getattr(dtype, "itemsize", 0) if dtype is not None else 0


def _size(aval: Any) -> int:
    return math.prod(getattr(aval, "shape", ()))


def live_flops(jaxpr: jax_core.Jaxpr) -> int:
    """FLOPs of ``jaxpr`` once equations whose results nobody reads are dropped (as XLA
    drops them): ``jax.grad`` traces a JVP of every operation, ``stop_gradient`` ones
    included, whose tangents are dead."""
    live, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    return jaxpr_flops(live)


def jaxpr_flops(jaxpr: jax_core.Jaxpr) -> int:
    """FLOPs of one execution of ``jaxpr``."""
    return sum(eqn_flops(e.primitive.name, e.params, [v.aval for v in e.invars],
                         [v.aval for v in e.outvars]) for e in jaxpr.eqns)


def _sub(params: Mapping[str, Any], key: str) -> jax_core.Jaxpr:
    sub = params[key]
    return sub.jaxpr if hasattr(sub, "jaxpr") else sub


def eqn_flops(name: str, params: Mapping[str, Any], in_avals: list, out_avals: list) -> int:
    """FLOPs of one application of primitive ``name``."""
    out = sum(_size(a) for a in out_avals)
    if name == "call_hi_primitive" and isinstance(params["_prim"], CheckpointName):
        return 0  # ``checkpoint_name`` with ``jax_remat3`` on
    if name == "dot_general":
        (lhs_contract, _), _ = params["dimension_numbers"]
        k = math.prod(in_avals[0].shape[d] for d in lhs_contract)
        return 2 * out * k
    if name == "conv_general_dilated":
        rhs = in_avals[1].shape
        out_feature_dim = params["dimension_numbers"].rhs_spec[0]
        return 2 * out * (math.prod(rhs) // rhs[out_feature_dim])
    if name == "scan":
        return params["length"] * jaxpr_flops(_sub(params, "jaxpr"))
    if name == "cond":
        return max(jaxpr_flops(b.jaxpr) for b in params["branches"])
    if name == "while":
        return jaxpr_flops(_sub(params, "body_jaxpr")) + jaxpr_flops(_sub(params, "cond_jaxpr"))
    if name == "shard_map":
        return manual_devices(params) * jaxpr_flops(_sub(params, "jaxpr"))
    for key in ("jaxpr", "call_jaxpr"):
        if key in params:
            return jaxpr_flops(_sub(params, key))
    if name in COLLECTIVES:
        return FLOPS_PER_COMM_BYTE * comm_bytes(name, in_avals, out_avals)
    if name in _FREE:
        return 0
    if name in _ELEMENTWISE:
        return out
    if name in _REDUCTIONS:
        return sum(_size(a) for a in in_avals)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"autoremat has no cost model for primitive {name!r}; assuming a conservative "
            "10 FLOPs per element read or written.", stacklevel=2)
    return 10 * (out + sum(_size(a) for a in in_avals))
