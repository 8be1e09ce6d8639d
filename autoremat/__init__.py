"""autoremat: automatic rematerialization for JAX under a memory budget.

>>> loss = autoremat.optimize(loss_fn, budget="6GiB")   # doctest: +SKIP
>>> grads = jax.jit(jax.grad(loss))(params, batch)      # doctest: +SKIP
"""

from autoremat._budget import parse_budget as parse_budget
from autoremat._plan import InfeasibleBudgetError as InfeasibleBudgetError
from autoremat._plan import Plan as Plan
from autoremat._plan import SolverTimeoutError as SolverTimeoutError
from autoremat._plan import optimize as optimize
from autoremat._plan import plan as plan
from autoremat._rewrite import PlanMismatchError as PlanMismatchError
from autoremat._trace import UnsupportedProgramError as UnsupportedProgramError

__all__ = [
    "InfeasibleBudgetError",
    "Plan",
    "PlanMismatchError",
    "SolverTimeoutError",
    "UnsupportedProgramError",
    "optimize",
    "parse_budget",
    "plan",
]
