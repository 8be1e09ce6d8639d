"""Region signatures: a text equal for regions that compute the same thing."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from autoremat._program import Atom, Eqn, Segment


@dataclasses.dataclass(frozen=True, eq=False)
class Signature:
    """A text equal for regions that compute the same thing on inputs of the same shapes,
    and each value's position in it (inputs first, then what the region makes, in order).
    """

    text: str
    positions: Mapping[int, int]

    def ids(self, positions: Iterable[int]) -> list[int]:
        """The ids of this region's values at ``positions``."""
        by_position = {k: v for v, k in self.positions.items()}
        return [by_position[k] for k in positions]


class SignatureTexts:
    """Signs the regions of one program, keeping each equation's text after its operands
    from one region to the next (a cache)."""

    def __init__(self, avals: Mapping[int, Any]) -> None:
        self._avals = avals
        self._texts: dict[Eqn, str] = {}

    def __len__(self) -> int:
        return len(self._texts)

    def sign(self, region: Segment, frozen: Collection[int] = ()) -> Signature:
        """The signature of ``region`` asked with its operands at positions ``frozen`` not
        differentiated."""
        positions = {v: k for k, v in enumerate(region.inputs)}
        parts = [";".join(str(self._avals[v]) for v in region.inputs),
                 f"frozen {sorted(frozen)}", f"written {region.written}"]
        self._write(region.eqns, positions, parts)
        parts.append(",".join(_atom(o, positions) for o in region.outputs))
        return Signature("\n".join(parts), positions)

    def _write(self, eqns: Sequence[Eqn], positions: dict[int, int], parts: list[str]) -> None:
        for e in eqns:
            for o in e.outs:
                positions.setdefault(o, len(positions))
            operands = ",".join(_atom(a, positions) for a in e.ins)
            parts.append(f"{e.primitive.name}({operands}){self._text(e)}")
            if e.scan_body is not None:
                body = e.scan_body
                for v in (*body.consts, *body.carry_in, *body.xs_in):
                    positions.setdefault(v, len(positions))
                self._write(body.eqns, positions, parts)
            if e.shard_body is not None:
                for v in e.shard_body.ins:
                    positions.setdefault(v, len(positions))
                self._write(e.shard_body.eqns, positions, parts)

    def _text(self, e: Eqn) -> str:
        if e not in self._texts:
            outs = ",".join(str(self._avals[o]) for o in e.outs)
            self._texts[e] = f"{sorted(e.params.items())!r}->{outs}"
        return self._texts[e]


def _atom(a: Atom, positions: Mapping[int, int]) -> str:
    if isinstance(a, int):
        return f"%{positions[a]}" if a in positions else f"#{a}"
    return f"{a.aval}={a.value!r}"
