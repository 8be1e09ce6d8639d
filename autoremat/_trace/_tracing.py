"""From a function and abstract arguments to a program, and to its graph."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax

from autoremat import _layout, _program, _sharding
from autoremat._graph import Graph
from autoremat._layout import Layout
from autoremat._placement import Placement
from autoremat._program import Program, Segment
from autoremat._trace._boundaries import segment_cuts
from autoremat._trace._effects import check_effects
from autoremat._trace._facts import program_facts
from autoremat._trace._graph_builder import graph_of


def trace_program(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
                  scan_pieces: Sequence[tuple[int, ...]] = (), layout: Layout = "dense"
                  ) -> Program:
    """The flattened forward program of ``flat_fn`` (flat array arguments to a flat list
    of outputs), checked for side effects a remat region cannot replay, its top-level
    scans split into ``scan_pieces`` (see :func:`split_program`), its values sized under
    ``layout`` (see :mod:`autoremat._layout`).

    Raises:
      ValueError: ``layout`` is not one of :data:`autoremat._layout.LAYOUTS`.
    """
    _layout.check(layout)
    program = _program.flatten(jax.make_jaxpr(flat_fn)(*avals))
    check_effects(program.eqns)
    return split_program(dataclasses.replace(program, layout=layout), avals, scan_pieces)


def split_program(program: Program, avals: Sequence[jax.ShapeDtypeStruct],
                  scan_pieces: Sequence[tuple[int, ...]]) -> Program:
    """``program`` (traced at ``avals``) with its top-level scans split into
    ``scan_pieces`` (:func:`autoremat._program.split_scans`; none when every entry is
    ``()``), with per-device shapes from the avals' shardings (:mod:`autoremat._sharding`),
    under ``program``'s layout.
    """
    if any(scan_pieces):
        split = _program.split_scans(program, scan_pieces, avals)
        program = dataclasses.replace(split, layout=program.layout)
    return _sharding.localize(program, [getattr(a, "sharding", None) for a in avals])


def trace(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
          placement: Placement | None = None, layout: Layout = "dense"
          ) -> tuple[Program, tuple[Segment, ...], Graph]:
    """Traces ``flat_fn`` (flat array arguments to a flat list of outputs).

    Args:
      flat_fn: the function.
      avals: its arguments' shapes and dtypes.
      placement: where its regions are (see :class:`autoremat._placement.Placement`); when
        None, cut at :func:`segment_cuts`, scans whole.
      layout: how values are sized (see :mod:`autoremat._layout`).

    Returns:
      The flattened program, its regions, and the value graph.
    """
    whole = trace_program(flat_fn, avals, layout=layout)
    if placement is None:
        placement = Placement(cuts=segment_cuts(whole))
    program = split_program(whole, avals, placement.scan_pieces)
    facts = program_facts(program, split_from=whole if placement.splits_scans else None)
    return (program, *graph_of(program, placement, facts))
