"""Each value's fields that do not depend on the placement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoremat import _program
from autoremat._cost import eqn_flops
from autoremat._program import Atom, Eqn, Program
from autoremat._trace._common import source_of


def value_fields(program: Program, free: frozenset[int]
                  ) -> tuple[dict[int, dict[str, Any]], dict[Eqn, tuple[int, ...]]]:
    """Each value's :class:`Value` fields but ``region`` and ``needed``, and the ids each
    top-level equation makes."""
    fields: dict[int, dict[str, Any]] = {}
    order: list[int] = []

    def add(vid: int, mult: int, primitive: str, source: str, flops: int,
            inputs: Sequence[Atom], saveable: bool, recomputable: bool) -> None:
        aval = program.avals[vid]
        order.append(vid)
        fields[vid] = {
            "id": vid, "shape": tuple(aval.shape), "dtype": str(aval.dtype), "nbytes": program.value_bytes(vid),
            "multiplicity": mult, "primitive": primitive, "source": source, "flops": flops,
            "inputs": tuple(dict.fromkeys(a for a in inputs if isinstance(a, int) and a not in free)),
            "saveable": saveable, "recomputable": recomputable}

    def add_eqns(eqns: Sequence[Eqn], mult: int, alias: dict[int, Atom]) -> None:
        for e in eqns:
            ins = [alias.get(a, a) if isinstance(a, int) else a for a in e.ins]
            if e.shard_body is not None:
                add_shard_map(e, ins, mult, alias)
                continue
            in_avals = [program.avals[a] if isinstance(a, int) else a.aval
                        for a in e.ins]
            flops = eqn_flops(e.primitive.name, e.params, in_avals, [program.avals[o] for o in e.outs])
            top_scan = e.scan_body is not None
            source = source_of(e)
            for o in e.outs:
                add(o, mult, e.primitive.name, source, flops // max(1, len(e.outs)),
                    ins, saveable=True, recomputable=not top_scan)
            if e.primitive.name == "name" and not _program.is_value_name(e.params["name"]):
                fields[e.outs[0]]["user_name"] = e.params["name"]

    def add_shard_map(e: Eqn, ins: Sequence[Atom], mult: int, alias: dict[int, Atom]) -> None:
        """A ``shard_map``'s body values (per device), and its results, computed from the
        body's for free (recomputing one re-runs the body's share of the work)."""
        body = e.shard_body
        inner = {**alias, **dict(zip(body.ins, ins))}
        add_eqns(body.eqns, mult, inner)
        source = source_of(e)
        for o, b in zip(e.outs, body.outs):
            add(o, mult, e.primitive.name, source, 0,
                [inner.get(b, b)] if isinstance(b, int) else [], saveable=True,
                recomputable=True)

    def add_scan(scan: Eqn) -> None:
        body, length = scan.scan_body, scan.params["length"]
        outer_consts, _, outer_xs = _program.scan_operands(scan, scan.ins)
        add_eqns([scan], 1, {})
        source = source_of(scan)
        for c in body.carry_in:
            add(c, length, "carry_in", source, 0, (), saveable=True, recomputable=False)
        for x, outer in zip(body.xs_in, outer_xs):
            add(x, length, "xs_in", source, 0, (outer,), saveable=False, recomputable=True)
        add_eqns(body.eqns, length, dict(zip(body.consts, outer_consts)))
        # JAX hoists residuals computed from loop invariants alone: saved once, not per step.
        invariant = set(body.consts)
        for e in body.eqns:
            if all(not isinstance(a, int) or a in invariant or a in free for a in e.ins):
                invariant.update(e.outs)
                for o in e.outs:
                    fields[o]["multiplicity"] = 1

    made: dict[Eqn, tuple[int, ...]] = {}
    for e in program.eqns:
        first = len(order)
        if e.scan_body is None:
            add_eqns([e], 1, {})
        else:
            add_scan(e)
        made[e] = tuple(order[first:])
    return fields, made
