"""The remat problem as a frozen record of plain arrays, and a solve's outcome.

Each of ``V`` values, in program order, is saved, recomputed (or, with host offload,
offloaded) or left alone; values belong to ``R`` *regions* (one ``jax.checkpoint`` each)
numbered in program order. The bytes in use at each region's stages are the memory model
of :mod:`autoremat_ilp.memory`; the feasibility rules and the integer program are in
:mod:`autoremat_ilp.model` (and the package's ``README.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import numpy as np

from autoremat_ilp.status import Status

__all__ = ["NO_CAP", "Adjacency", "Problem", "ReservedBound", "Solution"]

# The ``reserved_cap`` of a bound whose values and buffers count in full.
NO_CAP = int(np.iinfo(np.int64).max)


class ReservedBound(NamedTuple):
    """One further stage bound: the bytes each saved value counts in it (``held``, and
    at its own region's forward stage ``forward_held``; 0 for the values it leaves out)
    and the reserved bytes taken off it at each region's stages (``room``)."""

    held: np.ndarray
    forward_held: np.ndarray
    room: np.ndarray


class Adjacency(NamedTuple):
    """Each value's inputs, readers, and readers in its own region, from ``edges``
    (Python lists: walking them value by value is several times faster than arrays)."""

    inputs: list[list[int]]
    readers: list[list[int]]
    local_readers: list[list[int]]


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """A save/recompute (and offload) problem over ``V`` values and ``R`` regions.

    Attributes:
      cost: recompute cost of each value (all its instances).
      held: bytes kept from the value's region's stage on if it is saved.
      transient: bytes live during its region's backward stage if it is recomputed.
      region: region of each value, ``0..R-1`` in program order.
      base: bytes in use at each region's backward stage whatever the plan.
      forward_base: bytes in use at each region's forward stage whatever the plan.
      forward_held: bytes a saved value adds to its own region's forward stage (beyond
        what ``forward_base`` already counts).
      must_cover: values the backward pass reads: saved, recomputed or offloaded.
      must_save: values another region reads: saved.
      can_save, can_recompute: the values that may be saved, recomputed.
      edges: ``(E, 2)`` array of ``(input, consumer)`` value indices.
      can_offload: the values that may be offloaded to host memory; ``None`` (the
        default) disables offload and leaves the model exactly as without it.
      offload_cost: cost of offloading each value (same units as ``cost``).
      offload_forward: bytes an offloaded value adds to its region's forward stage.
      offload_backward: bytes an offloaded value adds to its region's backward stage.
      host_budget: most bytes offloaded values may occupy in host memory (an offloaded
        value takes ``held[v]`` there).
      reserved_base, reserved_forward_base, unshared, reserved_room, reserved_cap,
        reserved_fit: the
        further bounds on each stage (reserved buffers,
        :func:`autoremat_ilp.memory.stage_bytes`): its bytes whatever the plan, with the
        reserved buffers, at each backward and forward stage; ``unshared``, a mask over
        the values, or one per bound (``(K, V)``), of those counted; ``reserved_room``,
        per bound, the reserved bytes those values may share, taken off the bound: one
        figure (``(K,)``) or one per region's stages (``(K, R)``) (``None``: none);
        ``reserved_cap``, per bound, the most bytes one value counts in it (``(K,)``;
        ``None``: no cap): a reserved buffer holds one value at a time, so with a cap
        ``t`` each buffer's room is at most ``t`` and each value's bytes beyond ``t``
        may be left out; ``reserved_fit``, per bound, the bytes of the largest reserved
        buffer its values may share (``(K,)``; ``None``: no limit): a value of more
        bytes shares none and counts whole, capped or not. ``None`` (the default): no
        further bound.
      nest: per region, the nested group it belongs to (``-1``: none); ``None`` (the
        default): no nesting.
      released: per value, the region at whose backward stage a saved value is freed, at
        least its own (a value no later backward reads is freed at its own region's;
        one handed on, which only later regions read, at the first of those);
        ``None`` (the default): each value at its own region's.

    Example:
      >>> import numpy as np, autoremat_ilp as ilp
      >>> problem = ilp.Problem(  # two regions, one 10-byte value each
      ...     cost=np.array([100.0, 1.0]), held=np.array([10, 10]),
      ...     transient=np.array([10, 10]), region=np.array([0, 1]),
      ...     base=np.array([0, 0]), forward_base=np.array([5, 5]),
      ...     forward_held=np.array([0, 0]), must_cover=np.array([True, True]),
      ...     must_save=np.array([False, False]), can_save=np.array([True, True]),
      ...     can_recompute=np.array([True, True]), edges=np.zeros((0, 2), np.int64))
      >>> problem.num_values
      2
      >>> s = ilp.solve(problem, 15)  # a Solution; saving both would peak at 20
      >>> s.status.value, s.save.tolist(), s.recompute.tolist(), s.cost
      ('optimal', [False, True], [True, False], 100.0)
      >>> ilp.solve_min_peak(problem).peak
      10
      >>> save, recompute = np.array([True, False]), np.array([False, True])
      >>> ilp.evaluate(problem, save, recompute)  # (cost, peak)
      (1.0, 20)
      >>> ilp.stage_bytes(problem, save, recompute).tolist()  # backward 0, 1; forward 0, 1
      [10, 20, 5, 15]
      >>> ilp.violations(problem, np.array([False, False]), recompute)
      ['value 0 is read by the backward pass but neither saved nor recomputed']
      >>> ilp.prune(problem, np.array([True, True]), recompute)[1].tolist()  # saved anyway
      [False, False]
      >>> ilp.host_bytes(problem, None)
      0
      >>> ilp.build_model(problem, 15).milp.c.shape  # the Model's MILP, 7 columns
      (7,)
    """

    cost: np.ndarray
    held: np.ndarray
    transient: np.ndarray
    region: np.ndarray
    base: np.ndarray
    forward_base: np.ndarray
    forward_held: np.ndarray
    must_cover: np.ndarray
    must_save: np.ndarray
    can_save: np.ndarray
    can_recompute: np.ndarray
    edges: np.ndarray
    can_offload: np.ndarray | None = None
    offload_cost: np.ndarray | None = None
    offload_forward: np.ndarray | None = None
    offload_backward: np.ndarray | None = None
    host_budget: float = math.inf
    reserved_base: np.ndarray | None = None
    reserved_forward_base: np.ndarray | None = None
    unshared: np.ndarray | None = None
    reserved_room: np.ndarray | None = None
    reserved_cap: np.ndarray | None = None
    reserved_fit: np.ndarray | None = None
    nest: np.ndarray | None = None
    released: np.ndarray | None = None

    @property
    def release_region(self) -> np.ndarray:
        """Per value, the region at whose backward stage it is freed, saved
        (``released``, or its own region)."""
        return self.region if self.released is None else self.released

    def reserved_bounds(self) -> list[ReservedBound]:
        """The further stage bounds (see ``unshared``, ``reserved_room``,
        ``reserved_cap``); empty without reserved buffers."""
        if self.unshared is None:
            return []
        masks = np.atleast_2d(self.unshared).astype(bool)
        K = len(masks)
        room = np.zeros(K, np.int64) if self.reserved_room is None \
            else np.asarray(self.reserved_room, np.int64)
        room = np.broadcast_to(room.reshape(K, -1), (K, self.num_regions))
        caps, fits = (np.full(K, NO_CAP) if a is None else np.asarray(a, np.int64)
                      for a in (self.reserved_cap, self.reserved_fit))
        return [ReservedBound(self._counted(self.held, m, c, f),
                              self._counted(self.forward_held, m, c, f), r)
                for m, r, c, f in zip(masks, room, caps, fits, strict=True)]

    def _counted(self, nbytes: np.ndarray, mask: np.ndarray, cap: int, fit: int
                 ) -> np.ndarray:
        """The bytes each value of ``mask`` counts in a bound of cap ``cap`` whose
        largest reserved buffer is ``fit`` bytes: at most ``cap`` where it fits in one,
        whole where it fits in none; 0 outside ``mask``."""
        return np.where(mask, np.where(self.held > fit, nbytes, np.minimum(nbytes, cap)), 0)

    def lazy_bounds(self) -> np.ndarray:
        """Which further stage bounds have a cap (``reserved_cap``): the solves leave
        them out until a plan breaks one (:mod:`autoremat_ilp.portfolio`)."""
        if self.unshared is None:
            return np.zeros(0, dtype=bool)
        if self.reserved_cap is None:
            return np.zeros(len(np.atleast_2d(self.unshared)), dtype=bool)
        return np.asarray(self.reserved_cap) < NO_CAP

    def with_bounds(self, keep: np.ndarray) -> Problem:
        """The problem with only the further stage bounds of the mask ``keep``."""
        if self.unshared is None:
            return self
        K = len(keep)

        def kept(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.asarray(a).reshape(K, -1)[keep]

        def per_bound(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.asarray(a)[keep]

        return dataclasses.replace(self, unshared=np.atleast_2d(self.unshared)[keep],
                                   reserved_room=kept(self.reserved_room),
                                   reserved_cap=per_bound(self.reserved_cap),
                                   reserved_fit=per_bound(self.reserved_fit))

    @functools.cached_property
    def adjacency(self) -> Adjacency:
        """The values' :class:`Adjacency`."""
        adjacency = Adjacency(*([[] for _ in range(self.num_values)] for _ in range(3)))
        region = self.region.tolist()
        for u, v in self.edges.tolist():
            adjacency.inputs[v].append(u)
            adjacency.readers[u].append(v)
            if region[u] == region[v]:
                adjacency.local_readers[u].append(v)
        return adjacency

    @property
    def num_values(self) -> int:
        return len(self.cost)

    @property
    def num_regions(self) -> int:
        return len(self.base)

    @property
    def offloading(self) -> bool:
        """Whether any value may be offloaded (the model then has offload variables)."""
        return self.can_offload is not None and bool(np.any(self.can_offload))


@dataclasses.dataclass(frozen=True, eq=False)
class Solution:
    """A solve's outcome.

    Attributes:
      status: how the solve ended.
      save, recompute: boolean masks of the plan; ``None`` when no plan was found.
      cost, peak: the plan's, exact (:func:`autoremat_ilp.memory.evaluate`); for an
        ``INFEASIBLE`` result of :func:`autoremat_ilp.solve`, ``peak`` is the least peak.
      bound: a lower bound on the objective (the cost, or the peak for
        :func:`autoremat_ilp.solve_min_peak`).
      gap: the relative gap between the plan's objective and ``bound``.
      wall_s: seconds the solve took.
      offload: the offload mask when the problem allows offload, else ``None``.
      timed_out: the time limit stopped a MILP solve this outcome was chosen among (it
        may then differ on another machine, or under another load).
    """

    status: Status
    save: np.ndarray | None
    recompute: np.ndarray | None
    cost: float
    peak: int
    bound: float
    gap: float
    wall_s: float
    offload: np.ndarray | None = None
    timed_out: bool = False
