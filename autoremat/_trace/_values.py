"""Each value's fields that do not depend on the placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from autoremat import _program
from autoremat._cost import eqn_flops, fuses, fusible
from autoremat._program import Atom, Eqn, Program
from autoremat._trace._common import source_of
from autoremat._trace._relayouts import relayouts


@dataclasses.dataclass(frozen=True)
class ValueFacts:
    """The fields of a value's :class:`autoremat._graph.Value` that its program decides
    (see there); a placement may still lower ``multiplicity`` and clear ``saveable``.
    ``constants``: the program's constants its equation reads (through the operands of a
    loop or a ``shard_map``), which JAX keeps when it is recomputed."""

    id: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    multiplicity: int
    primitive: str
    source: str
    flops: int
    inputs: tuple[int, ...]
    saveable: bool
    recomputable: bool
    user_name: str | None = None
    constants: tuple[int, ...] = ()
    fused: bool = False
    relayout: bool = False


def value_facts(program: Program, free: frozenset[int]
                ) -> tuple[dict[int, ValueFacts], dict[Eqn, tuple[int, ...]]]:
    """Each value's :class:`ValueFacts` by id, and the ids each top-level equation makes
    (those of a scan's body and of a ``shard_map``'s included), in program order."""
    table = _ValueTable(program, free)
    made: dict[Eqn, tuple[int, ...]] = {}
    for e in program.eqns:
        first = len(table.order)
        if e.scan_body is None:
            table.add_eqns([e], 1, {})
        else:
            table.add_scan(e)
        made[e] = tuple(table.order[first:])
    return table.values, made


class _ValueTable:
    """The :class:`ValueFacts` of a program's values, added equation by equation."""

    def __init__(self, program: Program, free: frozenset[int]) -> None:
        self.program = program
        self.free = free  # arguments and constants: left out of inputs
        self.relayouts = relayouts(program)
        self.values: dict[int, ValueFacts] = {}
        self.order: list[int] = []  # ids in the order added

    def add(self, vid: int, mult: int, primitive: str, source: str, flops: int,
            inputs: Sequence[Atom], *, saveable: bool, recomputable: bool,
            user_name: str | None = None, fused: bool | None = None,
            relayout: bool = False) -> None:
        """Adds value ``vid``; ``fused``: whether XLA fuses it into its consumers (by
        default, whether ``primitive`` is :func:`autoremat._cost.fusible`)."""
        aval = self.program.avals[vid]
        self.order.append(vid)
        self.values[vid] = ValueFacts(
            id=vid, shape=tuple(aval.shape), dtype=str(aval.dtype),
            nbytes=self.program.value_bytes(vid), multiplicity=mult, primitive=primitive,
            source=source, flops=flops,
            inputs=tuple(dict.fromkeys(a for a in inputs
                                       if isinstance(a, int) and a not in self.free)),
            saveable=saveable, recomputable=recomputable, user_name=user_name,
            fused=fusible(primitive) if fused is None else fused, relayout=relayout,
            constants=tuple(dict.fromkeys(a for a in inputs
                                          if isinstance(a, int) and a in self.program.consts)))

    def add_eqns(self, eqns: Sequence[Eqn], mult: int, alias: Mapping[int, Atom]) -> None:
        """The outputs of ``eqns``, each kept ``mult`` times if saved, reading ``alias``'s
        values for its ids (a loop body's constants are the loop's operands)."""
        avals = self.program.avals
        for e in eqns:
            ins = [alias.get(a, a) if isinstance(a, int) else a for a in e.ins]
            if e.shard_body is not None:
                self.add_shard_map(e, ins, mult, alias)
                continue
            flops = eqn_flops(e.primitive.name, e.params,
                              [avals[a] if isinstance(a, int) else a.aval for a in e.ins],
                              [avals[o] for o in e.outs])
            user_name = e.params["name"] if e.primitive.name == "name" \
                and not _program.is_value_name(e.params["name"]) else None
            source = source_of(e)
            for o in e.outs:
                self.add(o, mult, e.primitive.name, source, flops // max(1, len(e.outs)), ins,
                         saveable=True, recomputable=e.scan_body is None,
                         user_name=user_name, fused=fuses(e.primitive.name, e.params),
                         relayout=o in self.relayouts)

    def add_shard_map(self, e: Eqn, ins: Sequence[Atom], mult: int,
                      alias: Mapping[int, Atom]) -> None:
        """A ``shard_map``'s body values (per device), and its results, computed from the
        body's for free (recomputing one re-runs the body's share of the work)."""
        body = e.shard_body
        assert body is not None  # called for shard_maps only
        inner = {**alias, **dict(zip(body.ins, ins, strict=True))}
        self.add_eqns(body.eqns, mult, inner)
        source = source_of(e)
        for o, b in zip(e.outs, body.outs, strict=True):
            self.add(o, mult, e.primitive.name, source, 0,
                     [inner.get(b, b)] if isinstance(b, int) else [], saveable=True,
                     recomputable=True)

    def add_scan(self, scan: Eqn) -> None:
        """A top-level scan's results, and its body's values, kept once per iteration."""
        body, length = scan.scan_body, scan.params["length"]
        assert body is not None  # a top-level scan
        outer_consts, _, outer_xs = _program.scan_operands(scan, scan.ins)
        self.add_eqns([scan], 1, {})
        source = source_of(scan)
        for c in body.carry_in:
            self.add(c, length, "carry_in", source, 0, (), saveable=True, recomputable=False)
        for x, outer in zip(body.xs_in, outer_xs, strict=True):
            self.add(x, length, "xs_in", source, 0, (outer,), saveable=False,
                     recomputable=True)
        self.add_eqns(body.eqns, length, dict(zip(body.consts, outer_consts, strict=True)))
        # JAX hoists residuals computed from loop invariants alone: saved once, not per step.
        invariant = set(body.consts)
        for e in body.eqns:
            if all(not isinstance(a, int) or a in invariant or a in self.free for a in e.ins):
                invariant.update(e.outs)
                for o in e.outs:
                    self.values[o] = dataclasses.replace(self.values[o], multiplicity=1)
