"""Small helpers the tracing modules share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax

from autoremat import _sharding, _source
from autoremat._program import Eqn


def source_of(eqn: Eqn) -> str:
    """``file:line`` of the user code that made ``eqn`` (:func:`autoremat._source.user_frame`)."""
    frame = _source.user_frame(eqn.source_info.traceback)
    return "?" if frame is None else f"{frame.file_name}:{frame.start_line}"


def abstract(ids: Sequence[int], avals: Mapping[int, Any]) -> list[jax.ShapeDtypeStruct]:
    """The values ``ids`` as abstract arguments (with their avals' explicit shardings)."""
    return [jax.ShapeDtypeStruct(avals[i].shape, avals[i].dtype,
                                 sharding=_sharding.leaf_sharding(None, avals[i]))
            for i in ids]


def is_float(aval: Any) -> bool:
    """Whether ``aval`` is of a floating-point (or complex) dtype."""
    return hasattr(aval, "dtype") and jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)


def produced(eqns: Sequence[Eqn]) -> list[int]:
    """Ids ``eqns`` produce, those of ``shard_map`` bodies included."""
    return [o for e in eqns
            for o in (*e.outs, *(produced(e.shard_body.eqns) if e.shard_body else ()))]
