"""The integer program autoremat plans with, framework-free: save, recompute or offload
each value under a peak-memory budget (see ``README.md`` beside this file).

:class:`Problem` states a problem in plain arrays; :func:`solve` and
:func:`solve_min_peak` solve it (:mod:`autoremat_ilp.portfolio`) through the MILP of
:mod:`autoremat_ilp.model`; :mod:`autoremat_ilp.memory` evaluates and checks any plan;
:mod:`autoremat_ilp.milp` is the generic MILP front end (HiGHS, SCIP, CBC) that
``autoremat_solvers`` uses too.
"""

from autoremat_ilp.memory import evaluate as evaluate
from autoremat_ilp.memory import host_bytes as host_bytes
from autoremat_ilp.memory import prune as prune
from autoremat_ilp.memory import stage_bytes as stage_bytes
from autoremat_ilp.memory import violations as violations
from autoremat_ilp.milp import Milp as Milp
from autoremat_ilp.milp import MilpResult as MilpResult
from autoremat_ilp.milp import Progress as Progress
from autoremat_ilp.milp import solve_milp as solve_milp
from autoremat_ilp.model import Model as Model
from autoremat_ilp.model import build_model as build_model
from autoremat_ilp.portfolio import solve as solve
from autoremat_ilp.portfolio import solve_min_peak as solve_min_peak
from autoremat_ilp.problem import Problem as Problem
from autoremat_ilp.problem import Solution as Solution
from autoremat_ilp.status import Status as Status

__all__ = [
    "Milp",
    "MilpResult",
    "Model",
    "Problem",
    "Progress",
    "Solution",
    "Status",
    "build_model",
    "evaluate",
    "host_bytes",
    "prune",
    "solve",
    "solve_milp",
    "solve_min_peak",
    "stage_bytes",
    "violations",
]
