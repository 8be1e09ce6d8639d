"""Where unrolled code is cut into regions."""

from __future__ import annotations

import math

import numpy as np

from autoremat._program import Program


def segment_cuts(program: Program) -> tuple[int, ...]:
    """Equation indices at which unrolled code starts a new segment.

    A cut can go where the bytes of earlier values still to be read are within 1.5x of
    the least such crossing in the middle 80% of the program: a layer boundary, where
    only the residual stream crosses. Cuts are then thinned so that each segment produces
    at least half of ``total produced bytes / sqrt(#equations)``. Scans always get regions
    of their own.
    """
    eqns = program.eqns
    n = len(eqns)
    if n < 4:
        return ()
    produced = np.zeros(n, np.int64)
    crossing = np.zeros(n + 1, np.int64)  # crossing[p]: bytes made before p, read at/after p
    born: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for a in e.ins:
            if isinstance(a, int) and a in born:
                last_use[a] = i
        for o in e.outs:
            born[o] = i
            produced[i] += program.value_bytes(o)
    for o, i in born.items():
        if o in last_use:
            crossing[i + 1] += program.value_bytes(o)
            crossing[last_use[o] + 1] -= program.value_bytes(o)
    crossing = np.cumsum(crossing)
    lo, hi = max(1, n // 10), max(2, n - n // 10)
    threshold = 1.5 * max(1, int(crossing[lo:hi].min()))
    min_size = 0.5 * produced.sum() / math.sqrt(n)
    acc = np.concatenate([[0], np.cumsum(produced)])
    cuts: list[int] = []
    for p in range(1, n):
        if crossing[p] <= threshold and acc[p] - acc[cuts[-1] if cuts else 0] >= min_size \
                and acc[n] - acc[p] >= min_size:
            cuts.append(p)
    return tuple(cuts)


def candidate_cuts(program: Program) -> tuple[tuple[int, ...], ...]:
    """Candidate region boundaries (:attr:`Placement.cuts`), finest first.

    The finest is :func:`segment_cuts`. Coarser ones keep every second of its cuts
    (both phases): where a layer is cut in two (attention | MLP), one of them cuts only
    at layer boundaries. Each region boundary is saved for the backward pass, so fewer
    regions save fewer copies of what crosses; larger regions recompute more at once.
    The planner solves each and keeps the cheapest plan that fits.
    """
    finest = segment_cuts(program)
    found = [finest]
    for phase in (0, 1):
        coarse = finest[phase::2]
        if len(finest) >= 3 and coarse not in found:
            found.append(coarse)
    return tuple(found)
