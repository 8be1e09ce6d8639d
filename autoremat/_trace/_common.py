"""Small helpers the tracing modules share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax._src import source_info_util

from autoremat import _sharding
from autoremat._program import Eqn


def source_of(eqn: Eqn) -> str:
    """``file:line`` of the user code that made ``eqn``."""
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is not None:
        return f"{frame.file_name}:{frame.start_line}"
    return source_info_util.summarize(eqn.source_info) or "?"


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
