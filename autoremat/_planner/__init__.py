"""The planner: the spine of autoremat, as stages over plain frozen data (see README.md)."""

from autoremat._planner._api import optimize as optimize
from autoremat._planner._api import plan as plan
from autoremat._planner._api import plan_with as plan_with
from autoremat._planner._load import load_plan as load_plan
from autoremat._planner._options import PlanOptions as PlanOptions
