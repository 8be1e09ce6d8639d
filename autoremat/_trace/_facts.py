"""What the graphs of one program share whatever the placement."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autoremat import _program
from autoremat._program import Eqn, Program
from autoremat._trace._common import abstract
from autoremat._trace._memory import cotangent_holders, differentiable
from autoremat._trace._residuals import step_flops
from autoremat._trace._values import value_fields


@dataclasses.dataclass(frozen=True, eq=False)
class ProgramFacts:
    """What the graphs of one program share whatever the placement (see :func:`graph_of`).

    Attributes:
      program: the program.
      fields: each value's :class:`Value` fields but ``region`` and ``needed``, by id.
      made: the ids each top-level equation makes (those of a scan's body and of a
        ``shard_map``'s included).
      free: the ids of the arguments and constants.
      differentiable: the values that carry a cotangent (:func:`differentiable`).
      holders: bytes the cotangent of each concatenated value holds
        (:func:`cotangent_holders`).
      fingerprint: the program's :func:`autoremat._program.fingerprint_of`.
      texts: what a region's signature writes for each equation after its operands,
        filled as regions are signed (see :func:`signature`).
      residuals: by region signature, what JAX was asked of the region: the positions of
        the values its VJP reads, those of the inputs it reads, the bytes of unnamed
        residuals, its step's FLOPs and the FLOPs JAX recomputes saving every name;
        filled as regions are asked.
      split_flops: for a program whose scans are split into pieces, the FLOPs its step
        (without remat) spends beyond the whole scans' (summing the gradients of the
        pieces' inputs).
    """

    program: Program
    fields: Mapping[int, Mapping[str, Any]]
    made: Mapping[Eqn, tuple[int, ...]]
    free: frozenset[int]
    differentiable: set[int]
    holders: Mapping[int, int]
    fingerprint: str
    texts: dict[Eqn, str] = dataclasses.field(default_factory=dict)
    residuals: dict[str, tuple[tuple[int, ...], set[int], int, int, int]] = dataclasses.field(
        default_factory=dict)
    split_flops: int = 0

    def cotangent_size(self, value_id: int) -> int:
        """Bytes the cotangent of value ``value_id`` holds."""
        return max(self.program.value_bytes(value_id), self.holders.get(value_id, 0))


def program_facts(program: Program, split_from: Program | None = None) -> ProgramFacts:
    """The :class:`ProgramFacts` of ``program``, whose scans were split from those of
    ``split_from`` (None: not split)."""
    free = frozenset(program.args) | frozenset(program.consts)
    fields, made = value_fields(program, free)
    split_flops = 0 if split_from is None else max(
        0, _program_step_flops(program) - _program_step_flops(split_from))
    return ProgramFacts(program, fields, made, free, differentiable(program),
                        cotangent_holders(program.eqns, program.value_bytes),
                        _program.fingerprint_of(program), split_flops=split_flops)


def _program_step_flops(program: Program) -> int:
    """FLOPs of ``program``'s forward and backward pass without remat."""
    regions = _program.split_regions(program)
    return step_flops(lambda *args: _program.run_program(program, regions, frozenset(), None,
                                                          args),
                       abstract(program.args, program.avals))
