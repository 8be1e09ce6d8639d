"""Optax: a training step whose remat plan leaves room for the optimizer state.

The plan is made for the loss's gradient computation, the part that holds activations;
the optimizer state is in memory through all of it (an argument of the step), so a byte
budget is reduced by the optimizer state's bytes before planning. The budget then bounds
the step's predicted peak: parameters, batch, their gradients, optimizer state, and the
activations and recomputation of the backward pass. The optimizer's update runs after
the backward pass has freed the activations and is not modelled (with donated buffers it
updates in place). A fractional budget (a float) is a fraction of the activation memory,
on top of everything that must be held, optimizer state included: it is unchanged, as
is ``"floor"``.

::

    from autoremat.integrations import optax as ar_optax

    step = jax.jit(ar_optax.TrainStep(loss_fn, optax.adam(1e-3), budget="4GiB"),
                   donate_argnums=(0, 1))
    params, opt_state, loss = step(params, opt_state, batch)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import optax

from autoremat import _planner
from autoremat._budget import Budget, parse_budget
from autoremat._errors import InfeasibleBudgetError
from autoremat._plan import Plan


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays in ``tree``.

    Args:
      tree: a pytree of arrays, tracers or ``jax.ShapeDtypeStruct``.

    Returns:
      The sum of their elements times item sizes.

    Example:
      >>> import jax.numpy as jnp
      >>> from autoremat.integrations.optax import tree_bytes
      >>> tree_bytes({"w": jnp.ones((4, 8)), "b": jnp.ones(8, jnp.bfloat16)})
      144
    """
    return sum(math.prod(jax.numpy.shape(x)) * jax.numpy.result_type(x).itemsize
               for x in jax.tree.leaves(tree))


__all__ = ["TrainStep", "tree_bytes"]


class TrainStep:
    """``step(params, opt_state, *batch) -> (params, opt_state, loss)``: one step of
    ``optimizer`` on ``loss_fn(params, *batch)``, its gradient computed under a remat plan
    that fits ``budget`` together with the optimizer state. Jit it (and donate
    ``params`` and ``opt_state``) as any training step; a plan is made per shapes.

    Args:
      loss_fn: ``loss_fn(params, *batch)``.
      optimizer: the Optax transformation.
      budget: peak bytes of the whole step, optimizer state included (the forms of
        :func:`autoremat.plan`).
      **plan_kw: :func:`autoremat.plan`'s keywords.

    Raises:
      autoremat.InfeasibleBudgetError: on the first call for a shape, with
        ``floor_bytes`` the smallest budget of the whole step, optimizer state included.

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> from autoremat.integrations import optax as ar_optax
      >>> def loss(w, x):
      ...     for _ in range(4):
      ...         x = jnp.tanh(x @ w)
      ...     return jnp.sum(x ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> opt = optax.adam(1e-3)
      >>> step = jax.jit(ar_optax.TrainStep(loss, opt, budget="floor"))
      >>> w, state, value = step(w, opt.init(w), x)
    """

    def __init__(self, loss_fn: Callable, optimizer: optax.GradientTransformation,
                 budget: Budget, **plan_kw: Any):
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.budget = parse_budget(budget)
        self.plan_kw = plan_kw
        self._losses: dict[Budget, Callable] = {}

    def loss_budget(self, opt_state: Any) -> Budget:
        """The budget the loss's gradient is planned under: a byte budget less the
        optimizer state's bytes (at least 1), a fraction or ``"floor"`` unchanged."""
        if not isinstance(self.budget, int):
            return self.budget
        return max(1, self.budget - tree_bytes(opt_state))

    def plan(self, params: Any, opt_state: Any, *batch: Any) -> Plan:
        """The plan for the loss's gradient at these shapes (its ``budget_bytes`` is
        :meth:`loss_budget`)."""
        with self._whole_step(opt_state):
            return _planner.plan(self.loss_fn, params, *batch, budget=self.loss_budget(opt_state),
                              **self.plan_kw)

    def __call__(self, params: Any, opt_state: Any, *batch: Any) -> tuple[Any, Any, Any]:
        budget = self.loss_budget(opt_state)
        if budget not in self._losses:
            self._losses[budget] = _planner.optimize(self.loss_fn, budget, **self.plan_kw)
        with self._whole_step(opt_state):
            loss, grads = jax.value_and_grad(self._losses[budget])(params, *batch)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @contextlib.contextmanager
    def _whole_step(self, opt_state: Any) -> Iterator[None]:
        """Restates the loss's infeasible budget for the whole step (state included)."""
        try:
            yield
        except InfeasibleBudgetError as e:
            if not isinstance(self.budget, int):
                raise
            raise InfeasibleBudgetError(
                self.budget, e.floor_bytes + tree_bytes(opt_state)) from None
