"""Budget parsing: bytes, strings with units, or a fraction of the no-remat activations."""

from __future__ import annotations

import numbers

import bitmath

ACCEPTED_FORMS = (
    "a positive int of bytes (6_000_000_000), a string with a binary or decimal unit "
    "('6GiB', '512MiB', '2GB', '1.5 TB'), a float in (0, 1] giving the fraction of the "
    "no-remat activation memory to allow (0.4), or 'floor' for the least memory the "
    "model allows"
)

Budget = int | float | str

# The budget form asking for the least memory the model allows.
FLOOR = "floor"


def parse_budget(budget: Budget) -> int | float | str:
    """A budget in one of its accepted forms, checked.

    Args:
      budget: an int of bytes; a string with a binary or decimal unit (``"6GiB"``,
        ``"512MiB"``, ``"2GB"``); a float in (0, 1], the fraction of the no-remat
        activation memory; or ``"floor"``, the least memory the model allows.

    Returns:
      Bytes (int), a fraction (float in (0, 1]) or :data:`FLOOR`.

    Raises:
      ValueError: ``budget`` is malformed or not positive; the message lists the forms.

    Example:
      >>> from autoremat import parse_budget
      >>> parse_budget("1.5GiB"), parse_budget(0.4), parse_budget("floor")
      (1610612736, 0.4, 'floor')
    """
    if isinstance(budget, bool):
        raise ValueError(f"budget {budget!r} is a bool; expected {ACCEPTED_FORMS}")  # noqa: TRY004
    if isinstance(budget, numbers.Integral):
        if int(budget) <= 0:
            raise ValueError(f"budget {budget!r} is not positive; expected {ACCEPTED_FORMS}")
        return int(budget)
    if isinstance(budget, numbers.Real):
        if not 0.0 < float(budget) <= 1.0:
            raise ValueError(
                f"budget {budget!r} is not a fraction in (0, 1]; expected {ACCEPTED_FORMS}")
        return float(budget)
    if isinstance(budget, str):
        if budget.strip().lower() == FLOOR:
            return FLOOR
        try:
            nbytes = bitmath.parse_string(budget.strip()).bytes
        except ValueError:
            raise ValueError(f"budget {budget!r} is malformed; expected {ACCEPTED_FORMS}") from None
        if nbytes < 1:
            raise ValueError(f"budget {budget!r} is below one byte; expected {ACCEPTED_FORMS}")
        return int(nbytes)
    raise ValueError(
        f"budget {budget!r} has type {type(budget).__name__}; expected {ACCEPTED_FORMS}")


def format_bytes(nbytes: int) -> str:
    """``1610612736 -> '1.50 GiB'``."""
    return bitmath.Byte(nbytes).best_prefix(system=bitmath.NIST).format("{value:.2f} {unit}")
