"""Flax NNX: plan remat for a loss that takes an ``nnx.Module``.

The model is split into its graph definition (static, one plan per structure) and its
state (arrays), and the pure function ``loss(state, *batch)`` is planned and rewritten.
State the loss changes that is not a ``Param`` (batch statistics, RNG counters) is
returned by the pure function and written back to the model, as NNX does. Layers under
``nnx.scan`` become one remat region per iteration; ``nnx.remat`` inside the model is
replaced by the plan. Use the result with ``nnx.grad``/``nnx.value_and_grad`` and
``nnx.jit``::

    from autoremat.integrations import flax_nnx

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    fast_loss = flax_nnx.optimize(loss_fn, budget="2GiB")
    loss, grads = nnx.jit(nnx.value_and_grad(fast_loss))(model, x, y)

The budget covers the whole state as arguments and a gradient for each floating-point
leaf of it (a gradient of batch statistics is counted although ``nnx.grad`` takes none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax import nnx

from autoremat._budget import Budget
from autoremat._plan import Plan
from autoremat.integrations._functional import Functional

__all__ = ["apply", "optimize", "plan"]

_NNX = Functional(
    split=nnx.split,
    merge=nnx.merge,  # pyright: ignore[reportArgumentType]  (takes the GraphDef split gives)
    changed=lambda model: nnx.state(model, nnx.Not(nnx.Param)),
    write_back=nnx.update,
)


def optimize(loss_fn: Callable, budget: Budget, **plan_kw: Any) -> Callable:
    """``loss_fn(model, *args, **kwargs)`` with automatic remat under ``budget``.

    A plan is made on the first call for each model structure and argument shapes (as
    :func:`autoremat.optimize`).

    Args:
      loss_fn: ``loss_fn(model, *args, **kwargs)``, ``model`` an ``nnx.Module``.
      budget: as for :func:`autoremat.plan`.
      **plan_kw: :func:`autoremat.plan`'s keywords.

    Returns:
      ``loss_fn`` planned: same signature, outputs, gradients and state updates.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from autoremat.integrations import flax_nnx
      >>> model = nnx.Sequential(*[nnx.Linear(16, 16, rngs=nnx.Rngs(k)) for k in range(4)])
      >>> loss = lambda m, x: jnp.sum(jnp.tanh(m(x)) ** 2)
      >>> x = jnp.ones((32, 16))
      >>> grads = nnx.grad(flax_nnx.optimize(loss, budget="floor"))(model, x)
    """
    return _NNX.optimize(loss_fn, budget, **plan_kw)


def plan(loss_fn: Callable, model: nnx.Module, *args: Any, budget: Budget,
         **kwargs: Any) -> Plan:
    """The :class:`autoremat.Plan` for ``loss_fn(model, *args, **kwargs)``, to read, save or
    plot before use.

    Args:
      loss_fn: ``loss_fn(model, *args, **kwargs)``.
      model: the ``nnx.Module`` (its state's shapes are used).
      *args: the other example arguments.
      budget: as for :func:`autoremat.plan`.
      **kwargs: ``loss_fn``'s keywords and :func:`autoremat.plan`'s.

    Returns:
      The plan.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from autoremat.integrations import flax_nnx
      >>> model = nnx.Sequential(*[nnx.Linear(16, 16, rngs=nnx.Rngs(k)) for k in range(4)])
      >>> loss = lambda m, x: jnp.sum(jnp.tanh(m(x)) ** 2)
      >>> x = jnp.ones((32, 16))
      >>> p = flax_nnx.plan(loss, model, x, budget="floor")
      >>> p.peak_bytes <= p.no_remat_peak_bytes
      True
    """
    return _NNX.plan(loss_fn, model, *args, budget=budget, **kwargs)


def apply(plan: Plan, loss_fn: Callable) -> Callable:
    """``loss_fn`` following ``plan``.

    Args:
      plan: from :func:`plan` or :func:`autoremat.load_plan`, on the same model structure
        and shapes.
      loss_fn: the loss it was made for.

    Returns:
      ``loss_fn`` rewritten: same signature, outputs, gradients and state updates.

    Example:
      >>> import jax.numpy as jnp
      >>> from flax import nnx
      >>> from autoremat.integrations import flax_nnx
      >>> model = nnx.Sequential(*[nnx.Linear(16, 16, rngs=nnx.Rngs(k)) for k in range(4)])
      >>> loss = lambda m, x: jnp.sum(jnp.tanh(m(x)) ** 2)
      >>> x = jnp.ones((32, 16))
      >>> fast_loss = flax_nnx.apply(flax_nnx.plan(loss, model, x, budget="floor"), loss)
      >>> bool(jnp.allclose(fast_loss(model, x), loss(model, x)))
      True
    """
    return _NNX.apply(plan, loss_fn)
