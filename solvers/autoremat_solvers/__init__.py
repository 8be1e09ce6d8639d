"""Framework-independent rematerialization solvers on Checkmate-style graphs and schedules.

Every solver has the signature ``solve(graph, budget, time_limit_s) -> SolverResult``;
:data:`SOLVERS` maps their names to them. :func:`simulate` checks any schedule. The MILP
front end and the status every solver reports (:class:`Status`) are :mod:`autoremat_ilp`'s.
"""

from collections.abc import Callable

from autoremat_ilp import Status

from autoremat_solvers import (
    checkmate_lp_rounding,
    checkmate_milp,
    checkmate_tight,
    moccasin_cpsat,
    policy_schedule,
)
from autoremat_solvers.base import SolverResult
from autoremat_solvers.baselines import BASELINES
from autoremat_solvers.graph import (
    ComputeGraph,
    chain_training_graph,
    load_graph_json,
    random_layered_training_graph,
)
from autoremat_solvers.schedule import Schedule, SimResult, simulate

SOLVERS: dict[str, Callable[..., SolverResult]] = {
    "checkmate_milp": checkmate_milp.solve,
    "checkmate_milp_warm": checkmate_tight.solve,
    "checkmate_lp_rounding": checkmate_lp_rounding.solve,
    "moccasin_cpsat": moccasin_cpsat.solve,
    "jax_policy": policy_schedule.solve,
    **BASELINES,
}

__all__ = [
    "BASELINES",
    "SOLVERS",
    "ComputeGraph",
    "Schedule",
    "SimResult",
    "SolverResult",
    "Status",
    "chain_training_graph",
    "load_graph_json",
    "random_layered_training_graph",
    "simulate",
]
