"""The result type every solver returns (its status: :class:`autoremat_ilp.Status`)."""

from __future__ import annotations

import dataclasses
import math

from autoremat_ilp import Status

from autoremat_solvers.schedule import Schedule

__all__ = ["SolverResult"]


@dataclasses.dataclass(frozen=True)
class SolverResult:
    """A schedule (``None`` when none was found) and what the solver claims about it.

    Attributes:
      schedule: the schedule, or ``None``.
      status: the solve's :class:`autoremat_ilp.Status`.
      claimed_cost: the cost the solver claims for the schedule.
      lower_bound: bounds the cost of any schedule at this budget under the solver's
        model (``math.inf`` when infeasibility is proven).
      wall_s: seconds the solve took.

    Example:
      >>> import autoremat_solvers as ars
      >>> graph = ars.chain_training_graph(4)
      >>> solve = ars.SOLVERS.get("checkmate_milp")
      >>> result = solve(graph, 1000, 10.0)
      >>> result.status.value, result.claimed_cost >= result.lower_bound
      ('optimal', True)
    """

    schedule: Schedule | None
    status: Status
    claimed_cost: float
    lower_bound: float
    wall_s: float

    @classmethod
    def below_floor(cls, wall_s: float) -> SolverResult:
        """The result for a budget under :meth:`ComputeGraph.memory_floor`."""
        return cls(None, Status.INFEASIBLE, math.inf, math.inf, wall_s)
