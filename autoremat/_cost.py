"""FLOP estimates per equation, recursing into sub-programs (scan-aware).

``dot_general`` costs ``2 * |out| * prod(contracting dims)``, a convolution
``2 * |out| * (kernel elements per output feature)``, elementwise ops and reductions one
FLOP per element, and data movement (reshapes, broadcasts, slices, converts) nothing. A
scan costs ``length`` times its body, a ``cond`` its most expensive branch. A primitive
this table does not know gets a conservative cost (ten FLOPs per element in and out) and
a warning, once per primitive.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from jax._src import core as jax_core

_FREE = frozenset(["reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "convert_element_type", "bitcast_convert_type", "slice", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "rev", "copy", "gather", "iota", "select_n", "tile", "stop_gradient", "name", "reduce_precision", "optimization_barrier", "device_put", "sharding_constraint", "split", "real", "imag", "complex", "empty", "zeros_like", "full_like", "pvary", "mesh_cast", "random_wrap", "random_unwrap", "random_seed", "random_bits", "threefry2x32", "psum_invariant", "empty2", "debug_print", "debug_callback"])

_ELEMENTWISE = frozenset(["add", "add_any", "sub", "mul", "div", "neg", "abs", "sign", "floor", "ceil", "round", "max", "min", "pow", "integer_pow", "square", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erf_inv", "lgamma", "digamma", "is_finite", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "rem", "nextafter", "clamp", "scatter-add", "scatter", "scatter_add", "select_and_scatter_add", "population_count", "clz", "conj"])

_REDUCTIONS = frozenset(["reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "reduce_xor", "reduce_window_max", "reduce_window_min", "reduce_window_sum", "reduce_window", "select_and_gather_add"])

_warned: set[str] = set()


def fusible(name: str) -> bool:
    """Whether XLA fuses ``name`` into its consumers, so its output need not exist."""
    return name in _FREE or name in _ELEMENTWISE


def fuses_cotangent(name: str) -> bool:
    """Whether the cotangent ``name``'s transpose sends to its inputs fuses into the
    consumers of that cotangent: true for elementwise and data-movement ops, and for
    reductions (whose transposes broadcast); false for dots, convolutions, loops and
    calls, whose transposes materialize their results."""
    return fusible(name) or name in _REDUCTIONS


def moves_data(name: str) -> bool:
    """Whether ``name`` moves or relayouts data without arithmetic (no FLOPs, but memory
    traffic when recomputed)."""
    return name in _FREE


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(np.prod(shape, dtype=np.int64))


def jaxpr_flops(jaxpr: jax_core.Jaxpr) -> int:
    """FLOPs of one execution of ``jaxpr``."""
    return sum(eqn_flops(e.primitive.name, e.params, [v.aval for v in e.invars],
                         [v.aval for v in e.outvars]) for e in jaxpr.eqns)


def _sub(params: dict, key: str) -> jax_core.Jaxpr:
    sub = params[key]
    return sub.jaxpr if hasattr(sub, "jaxpr") else sub


def eqn_flops(name: str, params: dict, in_avals: list, out_avals: list) -> int:
    """FLOPs of one application of primitive ``name``."""
    out = sum(_size(a) for a in out_avals)
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
    for key in ("jaxpr", "call_jaxpr"):
        if key in params:
            return jaxpr_flops(_sub(params, key))
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
