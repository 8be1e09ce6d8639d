"""autoremat: automatic rematerialization for JAX under a memory budget.

>>> loss = autoremat.optimize(loss_fn, budget="6GiB")   # doctest: +SKIP
>>> grads = jax.jit(jax.grad(loss))(params, batch)      # doctest: +SKIP
"""

from autoremat._budget import parse_budget as parse_budget
from autoremat._errors import AutorematError as AutorematError
from autoremat._errors import BudgetNotVerifiedError as BudgetNotVerifiedError
from autoremat._errors import CompilerUnavailableError as CompilerUnavailableError
from autoremat._errors import InfeasibleBudgetError as InfeasibleBudgetError
from autoremat._errors import PlanMismatchError as PlanMismatchError
from autoremat._errors import PolicyFileError as PolicyFileError
from autoremat._errors import PolicyMismatchError as PolicyMismatchError
from autoremat._errors import SolverTimeoutError as SolverTimeoutError
from autoremat._errors import UnsupportedProgramError as UnsupportedProgramError
from autoremat._measure import TARGETS as TARGETS
from autoremat._measure import Measurement as Measurement
from autoremat._measure import fits as fits
from autoremat._measure import local_target as local_target
from autoremat._measure import measure_step as measure_step
from autoremat._offload import OffloadConfig as OffloadConfig
from autoremat._op_times import OpTimes as OpTimes
from autoremat._op_times import measure_op_times as measure_op_times
from autoremat._placement import Placement as Placement
from autoremat._plan import Plan as Plan
from autoremat._planner import PlanOptions as PlanOptions
from autoremat._planner import load_plan as load_plan
from autoremat._planner import optimize as optimize
from autoremat._planner import plan as plan
from autoremat._policy_file import PolicyFile as PolicyFile
from autoremat._policy_file import save_plan as save_plan

__all__ = [
    "TARGETS",
    "AutorematError",
    "BudgetNotVerifiedError",
    "CompilerUnavailableError",
    "InfeasibleBudgetError",
    "Measurement",
    "OffloadConfig",
    "OpTimes",
    "Placement",
    "Plan",
    "PlanOptions",
    "PlanMismatchError",
    "PolicyFile",
    "PolicyFileError",
    "PolicyMismatchError",
    "SolverTimeoutError",
    "UnsupportedProgramError",
    "fits",
    "load_plan",
    "measure_op_times",
    "local_target",
    "measure_step",
    "optimize",
    "parse_budget",
    "plan",
    "save_plan",
]
