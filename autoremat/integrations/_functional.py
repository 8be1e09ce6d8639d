"""The part the model-object integrations share: a model as a static part and its arrays.

autoremat plans pure functions of arrays. A framework whose losses take a model object
(``loss(model, *batch)``) is planned through the pure function
``pure(static, arrays, *batch) = loss(merge(static, arrays), *batch)``, with ``static``
hashable (a static argument of :func:`autoremat.optimize`, so a plan is made per model
structure and argument shapes) and ``arrays`` a pytree of arrays. The model's state that
the loss changes (batch statistics, RNG counters) can be returned by the pure function and
written back to the model object after the call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable
from typing import Any

from autoremat import _planner
from autoremat._budget import Budget
from autoremat._plan import Plan


@dataclasses.dataclass(frozen=True)
class Functional:
    """How a framework's model object becomes arguments of a pure function.

    Attributes:
      split: ``model -> (static, arrays)``; ``static`` must be hashable.
      merge: ``(static, arrays) -> model``, a model object the loss can be called with.
      changed: ``model -> state`` after the loss ran, the state to write back; ``None``
        when models are immutable.
      write_back: ``(model, state) -> None``, applies ``changed``'s state to the caller's
        model.
    """

    split: Callable[[Any], tuple[Hashable, Any]]
    merge: Callable[[Hashable, Any], Any]
    changed: Callable[[Any], Any] | None = None
    write_back: Callable[[Any, Any], None] | None = None

    def pure(self, fn: Callable) -> Callable:
        """``pure(static, arrays, *args, **kwargs)``: ``fn`` on the merged model, returning
        ``(output, changed state)`` when the model has state to write back."""

        def pure(static: Hashable, arrays: Any, *args: Any, **kwargs: Any) -> Any:
            model = self.merge(static, arrays)
            out = fn(model, *args, **kwargs)
            return out if self.changed is None else (out, self.changed(model))

        return pure

    def _call(self, pure_fn: Callable, model: Any, args: tuple, kwargs: dict) -> Any:
        static, arrays = self.split(model)
        out = pure_fn(static, arrays, *args, **kwargs)
        if self.changed is None:
            return out
        out, state = out
        assert self.write_back is not None  # set with changed
        self.write_back(model, state)
        return out

    def plan(self, fn: Callable, model: Any, *args: Any, budget: Budget, **kwargs: Any
             ) -> Plan:
        """:func:`autoremat.plan` for ``fn(model, *args, **kwargs)``; its keywords
        (``time_limit_s``, ``verify``, ...) are taken from ``kwargs`` as there."""
        static, arrays = self.split(model)
        return _planner.plan(functools.partial(self.pure(fn), static), arrays, *args,
                          budget=budget, **kwargs)

    def apply(self, plan: Plan, fn: Callable) -> Callable:
        """``fn`` following ``plan`` (made by :meth:`plan`), with ``fn``'s signature."""
        pure_fn = self.pure(fn)

        @functools.wraps(fn)
        def applied(model: Any, *args: Any, **kwargs: Any) -> Any:
            planned = lambda static, *rest, **kw: plan.apply(
                functools.partial(pure_fn, static))(*rest, **kw)
            return self._call(planned, model, args, kwargs)

        return applied

    def optimize(self, fn: Callable, budget: Budget, **plan_kw: Any) -> Callable:
        """:func:`autoremat.optimize` for ``fn(model, *args, **kwargs)``: a plan per model
        structure and argument shapes, made on first call; ``fn``'s signature."""
        optimized = _planner.optimize(self.pure(fn), budget, static_argnums=0, **plan_kw)

        @functools.wraps(fn)
        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(optimized, model, args, kwargs)

        return wrapped
