"""The result type every solver returns."""

from __future__ import annotations

import dataclasses
import enum
import math

from autoremat_solvers.schedule import Schedule

__all__ = ["SolveStatus", "SolverResult"]


class SolveStatus(str, enum.Enum):
    """Outcome of a solver call."""

    OPTIMAL = "optimal"  # proven optimal for the solver's model
    FEASIBLE = "feasible"  # a schedule, optimality not proven
    INFEASIBLE = "infeasible"  # proven: no schedule fits the budget
    NO_SOLUTION = "no_solution"  # none found (time limit, or a heuristic that does not fit)


@dataclasses.dataclass(frozen=True)
class SolverResult:
    """A schedule (``None`` when none was found) and what the solver claims about it.

    ``lower_bound`` bounds the cost of any schedule at this budget under the solver's
    model (``math.inf`` when infeasibility is proven).
    """

    schedule: Schedule | None
    status: SolveStatus
    claimed_cost: float
    lower_bound: float
    wall_s: float

    @classmethod
    def below_floor(cls, wall_s: float) -> SolverResult:
        """The result for a budget under :meth:`ComputeGraph.memory_floor`."""
        return cls(None, SolveStatus.INFEASIBLE, math.inf, math.inf, wall_s)
