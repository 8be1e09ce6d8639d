"""How a solve ended: the one status every solver in ``autoremat_ilp`` and
``autoremat_solvers`` reports."""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(str, enum.Enum):
    """Outcome of a solve (of a MILP, of the remat problem, of a research solver)."""

    OPTIMAL = "optimal"  # proven optimal for the solver's model
    FEASIBLE = "feasible"  # a solution, optimality not proven (time limit): see the gap
    INFEASIBLE = "infeasible"  # proven: no solution fits
    NO_SOLUTION = "no_solution"  # none found (time limit, or a heuristic that does not fit)
    CUT_OFF = "cut_off"  # proven: no solution costs at most the cutoff the solve was given
