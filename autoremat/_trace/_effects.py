"""Side effects a remat region cannot replay, or runs again."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from jax._src import core as jax_core

from autoremat._errors import UnsupportedProgramError
from autoremat._program import Eqn
from autoremat._trace._common import source_of

# Effects JAX cannot differentiate through: a clear error instead of one from deep inside.
_NOT_DIFFERENTIABLE = frozenset({"pure_callback"})
# Effects jax.checkpoint refuses in a remat region, even inside a custom_vjp.
_NOT_RECOMPUTABLE = frozenset({"io_callback"})
# Effects that run again whenever their region is recomputed.
REPEATED_ON_RECOMPUTE = frozenset({"debug_print", "debug_callback"})
# Calls differentiated by the user's own rule.
_CUSTOM_RULES = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


def nested_eqns(eqns: Sequence[Any], in_rule: bool = False) -> Any:
    """``(equation, in_rule)`` for ``eqns`` and the equations of their sub-programs (scan,
    while and cond bodies, calls); ``in_rule``: inside a ``custom_jvp``/``custom_vjp``
    function, which its own rule differentiates."""
    for e in eqns:
        yield e, in_rule
        inner = in_rule or e.primitive.name in _CUSTOM_RULES
        for sub in jax_core.jaxprs_in_params(e.params):
            yield from nested_eqns(sub.eqns, inner)


def check_effects(eqns: Sequence[Eqn]) -> None:
    """Raises :class:`UnsupportedProgramError` for an effect a region cannot replay or
    differentiate; warns of one that runs again."""
    for e, in_rule in nested_eqns(eqns):
        name = e.primitive.name
        if name in _NOT_RECOMPUTABLE:
            raise UnsupportedProgramError(
                f"{name} at {source_of(e)} is a side effect that jax.checkpoint cannot replay "
                "in the backward pass (even inside a jax.custom_vjp), so its step cannot be "
                "planned; move it out of the differentiated function.")
        if name in _NOT_DIFFERENTIABLE and not in_rule:
            raise UnsupportedProgramError(
                f"{name} at {source_of(e)} has no derivative in JAX, so its step cannot be "
                "planned; wrap it in jax.custom_vjp, or move it out of the differentiated "
                "function.")
        if name in REPEATED_ON_RECOMPUTE:
            warnings.warn(f"{name} at {source_of(e)} runs again when autoremat recomputes its "
                          "region in the backward pass.", stacklevel=4)
