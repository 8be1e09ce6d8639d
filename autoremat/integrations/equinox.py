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
    assert isinstance(static, tuple)  # made by _split
    treedef, leaves = static
    return eqx.combine(arrays, jax.tree.unflatten(treedef, leaves))


_EQX = Functional(split=_split, merge=_merge)

__all__ = ["apply", "optimize", "plan"]


def optimize(loss_fn: Callable, budget: Budget, **plan_kw: Any) -> Callable:
    """``loss_fn(model, *args, **kwargs)`` with automatic remat under ``budget``.

    A plan is made on the first call for each model structure, static fields and
    argument shapes (as :func:`autoremat.optimize`).

    Args:
      loss_fn: ``loss_fn(model, *args, **kwargs)``, ``model`` an ``eqx.Module``.
      budget: as for :func:`autoremat.plan`.
      **plan_kw: :func:`autoremat.plan`'s keywords.

    Returns:
      ``loss_fn`` planned: same signature, outputs and gradients.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import autoremat.integrations.equinox as ar_eqx
      >>> model = eqx.nn.MLP(16, 1, 64, depth=4, key=jax.random.key(0))
      >>> loss = lambda m, x: jnp.sum(jax.vmap(m)(x) ** 2)
      >>> x = jnp.ones((32, 16))
      >>> grads = eqx.filter_grad(ar_eqx.optimize(loss, budget="floor"))(model, x)
    """
    return _EQX.optimize(loss_fn, budget, **plan_kw)


def plan(loss_fn: Callable, model: Any, *args: Any, budget: Budget, **kwargs: Any
         ) -> Plan:
    """The :class:`autoremat.Plan` for ``loss_fn(model, *args, **kwargs)``.

    Args:
      loss_fn: ``loss_fn(model, *args, **kwargs)``.
      model: the ``eqx.Module`` (its arrays' shapes are used).
      *args: the other example arguments.
      budget: as for :func:`autoremat.plan`.
      **kwargs: ``loss_fn``'s keywords and :func:`autoremat.plan`'s.

    Returns:
      The plan, to read, save or :func:`apply`.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import autoremat.integrations.equinox as ar_eqx
      >>> model = eqx.nn.MLP(16, 1, 64, depth=4, key=jax.random.key(0))
      >>> loss = lambda m, x: jnp.sum(jax.vmap(m)(x) ** 2)
      >>> p = ar_eqx.plan(loss, model, jnp.ones((32, 16)), budget="floor")
      >>> fast_loss = ar_eqx.apply(p, loss)
    """
    return _EQX.plan(loss_fn, model, *args, budget=budget, **kwargs)


def apply(plan: Plan, loss_fn: Callable) -> Callable:
    """``loss_fn`` following ``plan``.

    Args:
      plan: made by :func:`plan` (or :func:`autoremat.load_plan`) for the same model
        structure and shapes.
      loss_fn: the loss it was made for.

    Returns:
      ``loss_fn`` rewritten: same signature, outputs and gradients.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import autoremat.integrations.equinox as ar_eqx
      >>> model = eqx.nn.MLP(16, 1, 64, depth=4, key=jax.random.key(0))
      >>> loss = lambda m, x: jnp.sum(jax.vmap(m)(x) ** 2)
      >>> x = jnp.ones((32, 16))
      >>> fast_loss = ar_eqx.apply(ar_eqx.plan(loss, model, x, budget="floor"), loss)
      >>> bool(jnp.allclose(fast_loss(model, x), loss(model, x)))
      True
    """
    return _EQX.apply(plan, loss_fn)
