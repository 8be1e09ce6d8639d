"""Every error autoremat raises on purpose: one base class, each error a builtin's subclass.

Catch :class:`AutorematError` for all of them, or the builtin (``ValueError``,
``RuntimeError``) each one also is. Each message says what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoremat._budget import format_bytes


class AutorematError(Exception):
    """Base class of the errors autoremat raises."""


class InfeasibleBudgetError(AutorematError, ValueError):
    """No plan fits the budget. ``floor_bytes`` is the smallest budget that any plan fits."""

    def __init__(self, budget_bytes: int, floor_bytes: int, message: str | None = None):
        self.budget_bytes = budget_bytes
        self.floor_bytes = floor_bytes
        super().__init__(message or (
            f"no remat plan fits a budget of {budget_bytes} bytes ({format_bytes(budget_bytes)}); "
            f"the smallest feasible budget is {floor_bytes} bytes ({format_bytes(floor_bytes)}). "
            "Raise the budget, shrink the batch, or shard the step."))


class BudgetNotVerifiedError(InfeasibleBudgetError, RuntimeError):
    """The closed loop (``verify``) compiled its rounds, then the floor plans and the obvious
    plans, and none fit. ``floor_bytes`` is the lowest compiler peak among them: the
    smallest budget known to fit."""


class SolverTimeoutError(AutorematError, RuntimeError):
    """The solver's time limit passed before it found any plan within the budget."""


class CompilerUnavailableError(AutorematError, RuntimeError):
    """The compiler a target needs is not available in this process."""


class UnsupportedProgramError(AutorematError, ValueError):
    """The function contains an operation autoremat cannot plan around, or a sharding it
    cannot compile for the target of a measurement."""


class PlanMismatchError(AutorematError, ValueError):
    """A plan was applied to a function or argument shapes it was not made for."""


class PolicyFileError(AutorematError, ValueError):
    """A policy file is not valid JSON, not a policy file, of another format version, or
    has an invalid field. ``field`` names the field (``None`` when the file is not JSON)."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(message)


# Differences listed in a mismatch error before the rest are counted.
_MAX_LISTED = 20


class PolicyMismatchError(PlanMismatchError):
    """A policy file does not match the function and arguments it was loaded for.

    ``differences`` lists every difference found, one line each.
    """

    def __init__(self, where: str, differences: Sequence[str], note: str):
        self.differences = tuple(differences)
        listed = [f"  - {d}" for d in self.differences[:_MAX_LISTED]]
        if len(self.differences) > _MAX_LISTED:
            listed.append(f"  ... and {len(self.differences) - _MAX_LISTED} more")
        super().__init__(
            f"{where} does not match this function and these arguments:\n" + "\n".join(listed)
            + f"\n{note}Plan again for them (autoremat.plan then Plan.save, or `autoremat "
            "plan`), or load the file with the function and argument shapes it was made for.")
