"""What the graphs of one program share whatever the placement."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import jax
from jax._src import core as jax_core

from autoremat import _program
from autoremat._layout import Layout
from autoremat._program import Eqn, Program
from autoremat._trace._common import abstract
from autoremat._trace._memory import cotangent_holders, differentiable
from autoremat._trace._residuals import JaxAnswers, residual_bytes, residuals_as_written, step_flops
from autoremat._trace._signature import SignatureTexts
from autoremat._trace._values import ValueFacts, value_facts


@dataclasses.dataclass(frozen=True, eq=False)
class ProgramFacts:
    """What the graphs of one program share whatever the placement (see
    :func:`autoremat._trace.graph_of`), and the caches they fill.

    Attributes:
      program: the program.
      values: each value's :class:`ValueFacts`, by id.
      made: the ids each top-level equation makes (those of a scan's body and of a
        ``shard_map``'s included).
      free: the ids of the arguments and constants.
      differentiable: the values that carry a cotangent
        (:func:`autoremat._trace._memory.differentiable`).
      holders: bytes the cotangent of each concatenated value holds
        (:func:`autoremat._trace._memory.cotangent_holders`).
      fingerprint: the program's :func:`autoremat._program.fingerprint_of`.
      split_flops: for a program whose scans are split into pieces, the FLOPs its step
        (without remat) spends beyond the whole scans' (summing the gradients of the
        pieces' inputs).
      texts: a cache: what region signatures write for each equation, filled as regions
        are signed.
      answers: a cache: what JAX answered about each region signature, filled as regions
        are asked.
      written: the function the program was traced from and its arguments' avals, where
        the program runs as that function does on one device (not split, not sharded);
        otherwise ``None``.
    """

    program: Program
    values: Mapping[int, ValueFacts]
    made: Mapping[Eqn, tuple[int, ...]]
    free: frozenset[int]
    differentiable: frozenset[int]
    holders: Mapping[int, int]
    fingerprint: str
    split_flops: int
    texts: SignatureTexts
    answers: JaxAnswers
    written: tuple[Callable, Sequence[jax.ShapeDtypeStruct]] | None = None

    @functools.cached_property
    def residuals_as_written(self) -> tuple[jax_core.AbstractValue, ...] | None:
        """What JAX keeps for the backward pass of ``written`` run as written, without
        remat (arguments left out); ``None`` without ``written``."""
        return None if self.written is None else residuals_as_written(*self.written)

    def saved_bytes_as_written(self, layout: Layout) -> int | None:
        """Bytes of :attr:`residuals_as_written` under ``layout``: the ``saved_bytes`` of
        no remat; ``None`` without ``written``."""
        kept = self.residuals_as_written
        return None if kept is None else residual_bytes(kept, layout)

    def cotangent_size(self, value_id: int) -> int:
        """Bytes the cotangent of value ``value_id`` holds."""
        return max(self.program.value_bytes(value_id), self.holders.get(value_id, 0))


def program_facts(program: Program, split_from: Program | None = None,
                  written: tuple[Callable, Sequence[jax.ShapeDtypeStruct]] | None = None
                  ) -> ProgramFacts:
    """The :class:`ProgramFacts` of ``program``, whose scans were split from those of
    ``split_from`` (None: not split), traced from ``written`` (see
    :attr:`ProgramFacts.written`), with empty caches."""
    free = frozenset(program.args) | frozenset(program.consts)
    values, made = value_facts(program, free)
    split_flops = 0 if split_from is None else max(
        0, _program_step_flops(program) - _program_step_flops(split_from))
    return ProgramFacts(
        program=program, values=values, made=made, free=free,
        differentiable=frozenset(differentiable(program)),
        holders=cotangent_holders(program.eqns, program.value_bytes),
        fingerprint=_program.fingerprint_of(program), split_flops=split_flops,
        texts=SignatureTexts(program.avals), answers=JaxAnswers(), written=written)


def _program_step_flops(program: Program) -> int:
    """FLOPs of ``program``'s forward and backward pass without remat."""
    regions = _program.split_regions(program)
    return step_flops(lambda *args: _program.run_program(program, regions, frozenset(), None,
                                                         args),
                      abstract(program.args, program.avals))
