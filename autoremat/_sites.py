"""Sites: where and how a value is made, and a plan's decisions grouped by site.

A decision names the values it covers by site and occurrence, not by value id, so that it
survives re-tracing (see :mod:`autoremat._policy_file`); the report lists the same rows.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from autoremat._graph import Graph, Value


@dataclasses.dataclass(frozen=True)
class Site:
    """Where and how a value is made: the part of its identity that survives re-tracing.

    Attributes:
      source: ``file:line`` of the user code that made it.
      primitive: the producing primitive (``carry_in``/``xs_in`` for a scan body's inputs).
      shape, dtype: of one instance.
    """

    source: str
    primitive: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, value: Value) -> Site:
        return cls(value.source, value.primitive, tuple(value.shape), value.dtype)

    @property
    def key(self) -> tuple[str, str, tuple[int, ...], str]:
        """What two sites are compared by: the source's file name (not its directory)."""
        file, _, line = self.source.rpartition(":")
        source = f"{os.path.basename(file)}:{line}" if file and line.isdigit() else self.source
        return source, self.primitive, self.shape, self.dtype

    @property
    def array(self) -> str:
        """``float32[8,768]``."""
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def __str__(self) -> str:
        return f"{self.source} {self.primitive} {self.array}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """One action on some or all of the values made at one site.

    Attributes:
      action: ``"save"``, ``"recompute"`` or ``"offload"``.
      site: where the values are made.
      occurrences: which of the site's values, numbered from 0 in program order; ``None``
        for every one of them (for example the same value in every layer).
      of: how many values the function makes at the site.
      nbytes: bytes of one instance of one value.
      multiplicity: instances kept per value if saved (a scan's length).
      held_bytes: bytes one value takes saved: its ``multiplicity`` instances stacked as
        JAX keeps them (:attr:`autoremat._graph.Value.held_bytes`).
      recompute_flops: FLOPs of recomputing one value in every iteration of its region.
    """

    action: str
    site: Site
    occurrences: tuple[int, ...] | None
    of: int
    nbytes: int
    multiplicity: int
    recompute_flops: int
    held_bytes: int

    @property
    def count(self) -> int:
        """How many values the decision covers."""
        return self.of if self.occurrences is None else len(self.occurrences)


def values_by_site(graph: Graph) -> dict[tuple, list[Value]]:
    """The graph's values grouped by :attr:`Site.key`, each group in program order."""
    out: dict[tuple, list[Value]] = {}
    for v in graph.values:
        out.setdefault(Site.of(v).key, []).append(v)
    return out


def decisions_of(graph: Graph, actions: Mapping[int, str]) -> tuple[Decision, ...]:
    """The decisions of ``actions`` (an action per value id) on ``graph``: one per action,
    site, multiplicity and recompute cost, in program order of their first value."""
    flops = dict(zip(graph.array("id").tolist(), graph.recompute_flops().tolist(), strict=True))
    by_site = values_by_site(graph)
    groups: dict[tuple, list[int]] = {}
    for key, values in by_site.items():
        for k, v in enumerate(values):
            if v.id in actions:
                group = (actions[v.id], key, v.multiplicity, v.held_bytes, flops[v.id])
                groups.setdefault(group, []).append(k)
    decisions = []
    for (act, key, multiplicity, held, recompute_flops), occurrences in groups.items():
        first, of = by_site[key][0], len(by_site[key])
        decisions.append(Decision(
            action=act, site=Site.of(first),
            occurrences=None if len(occurrences) == of else tuple(occurrences), of=of,
            nbytes=first.nbytes, multiplicity=multiplicity,
            recompute_flops=int(recompute_flops), held_bytes=held))
    order = {v.id: i for i, v in enumerate(graph.values)}
    first_value = lambda d: order[by_site[d.site.key][(d.occurrences or (0,))[0]].id]
    return tuple(sorted(decisions, key=lambda d: (first_value(d), d.action)))


def site_difference(d: Decision, values: Sequence[Value],
                     by_site: Mapping[tuple, Sequence[Value]]) -> str:
    """Why the function's values at ``d``'s site are not the ones the file names."""
    if values:
        return f"{d.site}: {d.of} values in the file, {len(values)} in the function"
    source, primitive, shape, dtype = d.site.key
    near = [k for k in by_site if k[:2] == (source, primitive)]
    if not near:
        return f"{d.site}: not made by the function (no {primitive} at {source})"
    if all(k[3] == dtype for k in near):
        return (f"{d.site.source} {primitive}: shape {shape} in the file, "
                f"{' or '.join(str(k[2]) for k in near)} in the function")
    if all(k[2] == shape for k in near):
        return (f"{d.site.source} {primitive}: dtype {dtype} in the file, "
                f"{' or '.join(k[3] for k in near)} in the function")
    return (f"{d.site.source} {primitive}: {d.site.array} in the file, "
            f"{' or '.join(Site('', '', k[2], k[3]).array for k in near)} in the function")
