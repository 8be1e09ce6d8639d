"""Building schedules: frontier-advancing ones (stage ``t`` computes node ``t`` plus
recomputations) and conversions between schedules and plain sequences of computations."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import numpy as np

from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule


def recompute_closure(
    graph: ComputeGraph, resident: Collection[int], needed: Iterable[int]
) -> list[int]:
    """The nodes to compute so that ``needed`` are computed given ``resident`` values, ascending."""
    todo = list(needed)
    out: set[int] = set()
    while todo:
        v = todo.pop()
        if v in out:
            continue
        out.add(v)
        todo.extend(p for p in graph.preds[v] if p not in resident and p not in out)
    return sorted(out)


def prune_storage(graph: ComputeGraph, R: np.ndarray, S: np.ndarray) -> Schedule:
    """Drops kept values that the stage neither reads nor keeps further (same cost, less memory)."""
    S = S.copy()
    T = R.shape[0]
    for t in reversed(range(T)):
        read = np.zeros(graph.n, dtype=bool)
        for k in np.flatnonzero(R[t]):
            read[list(graph.preds[k])] = True
        keep_next = S[t + 1] if t + 1 < T else np.zeros(graph.n, dtype=bool)
        S[t] &= read | keep_next
    return Schedule(R, S)


def schedule_from_storage(graph: ComputeGraph, S: np.ndarray) -> Schedule:
    """The cheapest schedule for a given storage matrix (Checkmate's second rounding phase).

    ``S`` is first made consistent (``S[t, v] = 0`` for ``v >= t``); stage ``t`` computes
    ``t``, the values ``S[t + 1]`` asks for that are not in ``S[t]``, and their missing inputs.
    """
    n = graph.n
    S = np.tril(np.asarray(S, dtype=bool), k=-1)
    R = np.zeros((n, n), dtype=bool)
    for t in range(n):
        resident = set(np.flatnonzero(S[t]).tolist())
        wanted = {t} | (set(np.flatnonzero(S[t + 1]).tolist()) - resident if t + 1 < n else set())
        R[t, recompute_closure(graph, resident, wanted)] = True
    return prune_storage(graph, R, S)


KeepPolicy = Callable[[int, int, bool], bool]
"""``keep(t, v, recomputed)``: keep forward value ``v`` from stage ``t`` into ``t + 1``?"""


def schedule_from_policy(graph: ComputeGraph, keep: KeepPolicy) -> Schedule:
    """A schedule that recomputes missing inputs on demand and keeps what ``keep`` says.

    Stage ``t`` computes ``t`` and, recursively, whichever of its inputs are not in memory.
    A value with no consumer after stage ``t`` is dropped; backward values are kept until
    their last use; forward values are kept when ``keep(t, v, recomputed)`` holds, where
    ``recomputed`` says ``v`` was recomputed after its own stage.
    """
    n = graph.n
    last_user = [max(s, default=-1) for s in graph.succs]
    R = np.zeros((n, n), dtype=bool)
    S = np.zeros((n, n), dtype=bool)
    resident: set[int] = set()
    recomputed: set[int] = set()
    for t in range(n):
        S[t, list(resident)] = True
        comp = recompute_closure(graph, resident, [t])
        R[t, comp] = True
        recomputed |= {v for v in comp if v != t}
        resident = {
            v
            for v in resident.union(comp)
            if last_user[v] > t and (graph.backward[v] or keep(t, v, v in recomputed))
        }
        recomputed &= resident
    return prune_storage(graph, R, S)


def sequence_of(schedule: Schedule) -> list[int]:
    """The computations of ``schedule`` in execution order (stage by stage, ascending within)."""
    return [int(v) for row in schedule.R for v in np.flatnonzero(row)]


def schedule_from_sequence(graph: ComputeGraph, sequence: Iterable[int]) -> Schedule:
    """The schedule that runs ``sequence`` and keeps each value only until its last reader.

    Stages are the maximal ascending runs of ``sequence`` (the simulator computes a stage's
    nodes in ascending order). Every read uses the most recent computation of the value, which
    is kept from the stage after its computation through the stage of its last such read.
    """
    stages: list[list[int]] = []
    for v in sequence:
        if not stages or v <= stages[-1][-1]:
            stages.append([])
        stages[-1].append(v)
    R = np.zeros((len(stages), graph.n), dtype=bool)
    S = np.zeros_like(R)
    computed_in: dict[int, int] = {}  # node -> stage of its most recent computation
    for t, stage in enumerate(stages):
        R[t, stage] = True
        for k in stage:
            for p in graph.preds[k]:
                if p in computed_in:
                    S[computed_in[p] + 1 : t + 1, p] = True
            computed_in[k] = t
    return Schedule(R, S)
