"""The integer program of a :class:`~autoremat_ilp.problem.Problem`, one constraint family
at a time (Checkmate-style: each family is a function with its formula).

Variables (:class:`Variables`, laid out by :class:`ColumnLayout` in this order):
``save[v]`` and ``recompute[v]`` (binary, per value), ``held[i]`` (continuous, per region:
the bytes region ``i``'s saved values hold), ``peak`` (continuous, the objective of the
min-peak model), then ``offload[v]`` (binary, only when the problem allows offload),
``held_unshared[k, i]`` (continuous, only with reserved buffers: ``held[i]`` restricted to
the values of the ``k``-th reserved bound), and ``released[i]`` and
``released_unshared[k, i]`` (continuous, only when values are released at other regions'
backward stages than their own: ``held`` and ``held_unshared`` over the values region
``i`` releases).

Families, in row order: :func:`_cover`, :func:`_inputs`, :func:`_save_or_offload`,
:func:`_held` (again per reserved bound), :func:`_stage` (backward and forward stages,
again against each reserved bound), :func:`_host_memory`. The stage rows are the memory
model of :mod:`autoremat_ilp.memory`.

Objective: the total recompute cost plus offload cost under a budget, else the peak.
Bytes are in units of the largest value (:func:`memory_unit`), costs in units of the
largest cost (:func:`cost_unit`): coefficients near 1 keep the solver's tolerances
meaningful (bytes reach 1e10). The program has ``2V + R + 1`` variables (``V`` more with
offload, ``R`` more per reserved bound, twice as many ``held`` with releases) and
``O(V + E + R^2)`` nonzeros.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.sparse as sp

from autoremat_ilp.memory import windows
from autoremat_ilp.milp import Milp
from autoremat_ilp.problem import Problem

__all__ = ["ColumnLayout", "Model", "Variables", "build_model", "cost_unit", "memory_unit"]


class ColumnLayout:
    """The columns of a MILP, handed out in named blocks of consecutive variables."""

    def __init__(self) -> None:
        self.n = 0
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._integer: list[np.ndarray] = []

    def block(self, lb: np.ndarray, ub: np.ndarray | float, integer: bool) -> np.ndarray:
        """The columns of ``len(lb)`` new variables with bounds ``lb <= x <= ub``."""
        lb = np.asarray(lb, dtype=float)
        self._lb.append(lb)
        self._ub.append(np.broadcast_to(np.asarray(ub, dtype=float), lb.shape))
        self._integer.append(np.full(len(lb), integer))
        columns = self.n + np.arange(len(lb))
        self.n += len(lb)
        return columns

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(var_lb, var_ub, integer)`` of every column so far."""
        return (np.concatenate(self._lb), np.concatenate(self._ub),
                np.concatenate(self._integer))


class _Rows:
    """The rows ``lo <= A @ x <= hi`` of a MILP, added a family at a time."""

    def __init__(self) -> None:
        self.m = 0
        self._entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []

    def add(self, count: int, lo: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
        """The ids of ``count`` new rows with bounds ``lo`` and ``hi``."""
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (count,)))
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (count,)))
        rows = self.m + np.arange(count)
        self.m += count
        return rows

    def terms(self, rows: np.ndarray, columns: np.ndarray, coefs: np.ndarray) -> None:
        """Adds ``coefs[k] * x[columns[k]]`` to row ``rows[k]``."""
        self._entries.append((rows, columns, coefs.astype(float)))

    def matrix(self, n: int) -> sp.csr_matrix:
        rows, columns, coefs = (np.concatenate(a) for a in zip(*self._entries, strict=True))
        return sp.csr_matrix((coefs, (rows, columns)), shape=(self.m, n))


@dataclasses.dataclass(frozen=True, eq=False)
class Variables:
    """Where each variable of the model lives: its column(s) in the MILP.

    Attributes:
      save, recompute: per value.
      held: per region, the bytes its saved values hold (in memory units).
      peak: the column of the peak (the min-peak objective).
      offload: per value, with offload; else ``None``.
      held_unshared: per reserved bound and region, ``held`` over the values the bound
        counts (:meth:`Problem.reserved_bounds`), with reserved buffers; else ``None``.
      released, released_unshared: ``held`` and ``held_unshared`` by the region releasing
        the values (``Problem.released``), which the backward stages count; ``None``
        without releases (the backward stages count ``held`` then).
    """

    save: np.ndarray
    recompute: np.ndarray
    held: np.ndarray
    peak: int
    offload: np.ndarray | None
    held_unshared: np.ndarray | None
    released: np.ndarray | None = None
    released_unshared: np.ndarray | None = None

    def backward_held(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The columns the backward stages count saved values by: ``(released,
        released_unshared)``, or without releases ``(held, held_unshared)``."""
        if self.released is None:
            return self.held, self.held_unshared
        return self.released, self.released_unshared


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """The MILP of a problem (:func:`build_model`).

    Attributes:
      milp: the program.
      variables: the columns of its variables.
      unit: what the MILP's objective is divided by: :func:`cost_unit`, or
        :func:`memory_unit` for the peak.
    """

    milp: Milp
    variables: Variables
    unit: float


def memory_unit(problem: Problem) -> float:
    """The bytes the model's memory rows count in: the largest value's."""
    return float(max(1, problem.held.max(initial=1), problem.transient.max(initial=1)))


def cost_unit(problem: Problem) -> float:
    """The cost the model's objective counts in: the largest recompute or offload cost."""
    unit = max(1.0, float(problem.cost.max(initial=1.0)))
    if problem.offloading:
        assert problem.offload_cost is not None and problem.can_offload is not None
        unit = max(unit, float(problem.offload_cost[problem.can_offload].max(initial=1.0)))
    return unit


def _variables(problem: Problem, layout: ColumnLayout) -> Variables:
    V, R = problem.num_values, problem.num_regions
    # The blocks are laid out in this order.
    save = layout.block(problem.must_save, problem.can_save, integer=True)
    recompute = layout.block(np.zeros(V), problem.can_recompute, integer=True)
    held = layout.block(np.zeros(R), np.inf, integer=False)
    peak = int(layout.block(np.zeros(1), np.inf, integer=False)[0])
    offload = None
    if problem.offloading:
        assert problem.can_offload is not None
        offload = layout.block(np.zeros(V), problem.can_offload, integer=True)
    bounds = len(problem.reserved_bounds())

    def per_bound() -> np.ndarray | None:
        return (layout.block(np.zeros(bounds * R), np.inf, integer=False).reshape(bounds, R)
                if bounds else None)

    held_unshared = per_bound()
    released = released_unshared = None
    if problem.released is not None:
        released = layout.block(np.zeros(R), np.inf, integer=False)
        released_unshared = per_bound()
    return Variables(save=save, recompute=recompute, held=held, peak=peak, offload=offload,
                     held_unshared=held_unshared, released=released,
                     released_unshared=released_unshared)


def _cover(rows: _Rows, x: Variables, problem: Problem) -> None:
    """A value the backward pass reads is saved, recomputed or offloaded::

        save[v] + recompute[v] + offload[v] >= 1        for v in must_cover
    """
    cover = np.flatnonzero(problem.must_cover)
    ids = rows.add(len(cover), 1.0, np.inf)
    rows.terms(np.tile(ids, 2), np.concatenate([x.save[cover], x.recompute[cover]]),
               np.ones(2 * len(cover)))
    if x.offload is not None:
        rows.terms(ids, x.offload[cover], np.ones(len(cover)))


def _inputs(rows: _Rows, x: Variables, problem: Problem) -> None:
    """A recomputed value's inputs are saved or, within its region, recomputed or
    offloaded (an offloaded value is brought back for its own region's backward; a region
    cannot recompute another's values)::

        recompute[v] <= save[u] + same(u, v) * (recompute[u] + offload[u])
                                                        for (u, v) in edges
    """
    u, v = problem.edges[:, 0], problem.edges[:, 1]
    same = problem.region[u] == problem.region[v]
    ids = rows.add(len(u), -np.inf, 0.0)
    rows.terms(ids, x.recompute[v], np.ones(len(u)))
    rows.terms(ids, x.save[u], -np.ones(len(u)))
    rows.terms(ids[same], x.recompute[u[same]], -np.ones(int(same.sum())))
    if x.offload is not None:
        rows.terms(ids[same], x.offload[u[same]], -np.ones(int(same.sum())))


def _save_or_offload(rows: _Rows, x: Variables, problem: Problem) -> None:
    """A value is kept on the device, offloaded or neither::

        save[v] + offload[v] <= 1                       for v in can_offload
    """
    assert x.offload is not None and problem.can_offload is not None
    off = np.flatnonzero(problem.can_offload)
    ids = rows.add(len(off), -np.inf, 1.0)
    rows.terms(np.tile(ids, 2), np.concatenate([x.save[off], x.offload[off]]),
               np.ones(2 * len(off)))


def _held(rows: _Rows, held: np.ndarray, x: Variables, problem: Problem,
          nbytes: np.ndarray, unit: float, region: np.ndarray) -> None:
    """What the saved values of each region hold, in units, a value counted at its
    ``region`` (its own, or the one releasing it)::

        held[i] = sum(nbytes[v] * save[v] for v with region[v] = i) / unit
    """
    ids = rows.add(problem.num_regions, 0.0, 0.0)
    rows.terms(ids[region], x.save, -nbytes / unit)
    rows.terms(ids, held, np.ones(problem.num_regions))


def _stage(rows: _Rows, x: Variables, problem: Problem, unit: float, budget: float | None,
           *, base: np.ndarray, window: np.ndarray, held: np.ndarray,
           own: np.ndarray | None, transient: np.ndarray | None,
           offloaded: np.ndarray | None) -> None:
    """The bytes in use at each region's (backward or forward) stage fit the budget, or
    are at most ``peak`` without one (:mod:`autoremat_ilp.memory`)::

        base[i] + sum(held[j] for j in window[i])
                + sum(own[v] * save[v] + transient[v] * recompute[v]
                      + offloaded[v] * offload[v] for v in region i)  <= budget (or peak)
    """
    R = problem.num_regions
    base = base / unit
    ids = rows.add(R, -np.inf, -base if budget is None else budget / unit - base)
    tri_r, tri_c = np.nonzero(window)
    rows.terms(ids[tri_r], held[tri_c], np.ones(len(tri_r)))
    at = ids[problem.region]
    if own is not None:
        rows.terms(at, x.save, own.astype(float) / unit)
    if transient is not None:
        rows.terms(at, x.recompute, transient / unit)
    if x.offload is not None:
        assert offloaded is not None  # an offloading problem has offload bytes
        rows.terms(at, x.offload, offloaded.astype(float) / unit)
    if budget is None:
        rows.terms(ids, np.full(R, x.peak), -np.ones(R))


def _host_memory(rows: _Rows, x: Variables, problem: Problem, unit: float) -> None:
    """The offloaded values fit the host budget, tightened by more than the solver's
    feasibility tolerance (the budget is exact)::

        sum(held[v] * offload[v]) <= host_budget - 1e-6 * unit
    """
    assert x.offload is not None
    (row,) = rows.add(1, -np.inf, problem.host_budget / unit - 1e-6)
    rows.terms(np.full(problem.num_values, row), x.offload, problem.held / unit)


def _objective(x: Variables, problem: Problem, n: int, budget: float | None) -> np.ndarray:
    """``peak`` without a budget, else ``sum(cost[v] * recompute[v] + offload_cost[v] *
    offload[v])`` in units of :func:`cost_unit`."""
    c = np.zeros(n)
    if budget is None:
        c[x.peak] = 1.0
        return c
    c[x.recompute] = problem.cost / cost_unit(problem)
    if x.offload is not None:
        assert problem.offload_cost is not None  # an offloading problem has offload costs
        c[x.offload] = problem.offload_cost / cost_unit(problem)
    return c


def build_model(problem: Problem, budget: float | None) -> Model:
    """The integer program of ``problem`` (see the module doc).

    Args:
      problem: the problem.
      budget: the most bytes any stage may hold: the program minimizes the cost; ``None``:
        it minimizes the peak.

    Returns:
      A :class:`Model`: the MILP, where its variables are, and its objective's unit.
    """
    layout, rows = ColumnLayout(), _Rows()
    x = _variables(problem, layout)
    unit = memory_unit(problem)
    _cover(rows, x, problem)
    _inputs(rows, x, problem)
    if x.offload is not None:
        _save_or_offload(rows, x, problem)
    reserved = problem.reserved_bounds()
    for held, unshared, region in ((x.held, x.held_unshared, problem.region),
                                   (x.released, x.released_unshared, problem.released)):
        if held is None or region is None:
            continue
        _held(rows, held, x, problem, problem.held, unit, region)
        if unshared is not None:
            for held_k, bound in zip(unshared, reserved, strict=True):
                _held(rows, held_k, x, problem, bound.held, unit, region)
    backward, forward = windows(problem)
    released, released_unshared = x.backward_held()

    def stage(**kw):
        return _stage(rows, x, problem, unit, budget, **kw)

    stage(base=problem.base, window=backward, held=released, own=None,
          transient=problem.transient, offloaded=problem.offload_backward)
    stage(base=problem.forward_base, window=forward, held=x.held, own=problem.forward_held,
          transient=None, offloaded=problem.offload_forward)
    if x.held_unshared is not None:
        # ``unshared`` comes with both reserved bases, and ``released_unshared`` with
        # ``released``.
        assert problem.reserved_base is not None and problem.reserved_forward_base is not None
        assert released_unshared is not None
        for held, back, bound in zip(x.held_unshared, released_unshared, reserved,
                                     strict=True):
            stage(base=problem.reserved_base - bound.room, window=backward, held=back,
                  own=None, transient=problem.transient, offloaded=problem.offload_backward)
            stage(base=problem.reserved_forward_base - bound.room, window=forward, held=held,
                  own=bound.forward_held, transient=None, offloaded=problem.offload_forward)
    if x.offload is not None and math.isfinite(problem.host_budget):
        _host_memory(rows, x, problem, unit)
    milp = Milp(_objective(x, problem, layout.n, budget), rows.matrix(layout.n),
                np.concatenate(rows.lo), np.concatenate(rows.hi), *layout.bounds())
    return Model(milp, x, unit if budget is None else cost_unit(problem))
