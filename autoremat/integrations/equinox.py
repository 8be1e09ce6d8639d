"""Equinox: plan remat for a loss that takes an ``eqx.Module``.

The model is partitioned into its arrays (``eqx.is_array``) and the rest (static: one
plan per structure and static values), and the pure function ``loss(arrays, *batch)`` is
planned and rewritten. Use the result with ``eqx.filter_value_and_grad`` and
``eqx.filter_jit``::

    import autoremat.integrations.equinox as ar_eqx

    fast_loss = ar_eqx.optimize(loss_fn, budget="2GiB")   # loss_fn(model, x, y)
    loss, grads = eqx.filter_jit(eqx.filter_value_and_grad(fast_loss))(model, x, y)

The budget covers every array of the model as an argument and a gradient for each
floating-point one (``filter_value_and_grad`` differentiates exactly those).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import equinox as eqx
import jax

from autoremat._budget import Budget
from autoremat._plan import Plan
from autoremat.integrations._functional import Functional


def _split(model: Any) -> tuple[Hashable, Any]:
    arrays, static = eqx.partition(model, eqx.is_array)
    leaves, treedef = jax.tree.flatten(static)  # hashable, unlike lists in a module
    return (treedef, tuple(leaves)), arrays


def _merge(static: Hashable, arrays: Any) -> Any:
    treedef, leaves = static
    return eqx.combine(arrays, jax.tree.unflatten(treedef, leaves))


_EQX = Functional(split=_split, merge=_merge)


def optimize(loss_fn: Callable, budget: Budget, **plan_kw: Any) -> Callable:
    """``loss_fn(model, *args, **kwargs)`` with automatic remat under ``budget``.

    A plan is made on the first call for each model structure, static fields and
    argument shapes (as :func:`autoremat.optimize`; ``plan_kw`` are its keywords). Same
    signature, outputs and gradients as ``loss_fn``; static fields must be hashable.
    """
    return _EQX.optimize(loss_fn, budget, **plan_kw)


def plan(loss_fn: Callable, model: Any, *args: Any, budget: Budget, **kwargs: Any
         ) -> Plan:
    """The :class:`autoremat.Plan` for ``loss_fn(model, *args, **kwargs)``; ``kwargs``
    also take :func:`autoremat.plan`'s keywords."""
    return _EQX.plan(loss_fn, model, *args, budget=budget, **kwargs)


def apply(plan: Plan, loss_fn: Callable) -> Callable:
    """``loss_fn`` following ``plan`` (made for the same model structure and shapes)."""
    return _EQX.apply(plan, loss_fn)
