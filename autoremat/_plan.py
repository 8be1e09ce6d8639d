"""The :class:`Plan` record: what the planner decided for one function and its shapes.

Its methods are thin wrappers of the free functions that write, print and draw a plan
(:mod:`autoremat._policy_file`, :mod:`autoremat._report`, :mod:`autoremat._maxtext`,
:mod:`autoremat._plots`), which read a plan's fields and do not import this module.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from autoremat import _maxtext, _plots, _policy_file, _program, _report, _rewrite
from autoremat._graph import Graph
from autoremat._layout import Layout
from autoremat._offload import OffloadConfig
from autoremat._placement import Placement


@dataclasses.dataclass(frozen=True)
class Plan:
    """A remat plan for one function and one set of argument shapes.

    Attributes:
      saved: ids of the values kept as residuals (the rest the backward reads is recomputed).
      recomputed: ids of the values recomputed in the backward pass.
      budget_bytes: the budget the plan was solved for.
      peak_bytes: the predicted peak bytes of the whole gradient computation.
      saved_bytes: bytes of residuals kept between the forward and backward pass
        (arguments not included), counted under :attr:`layout`.
      recompute_flops: FLOPs the plan adds to the step: recomputed in the backward pass
        (what JAX recomputes whatever the plan included), and a split scan's gradient
        sums (``graph.fixed_flops``).
      step_flops: FLOPs of the forward and backward pass without remat.
      no_remat_peak_bytes: the predicted peak of no remat: of the function as written,
        whose compiler fuses elementwise chains into the backward pass
        (:func:`autoremat._solve.as_written`), where it runs as written; otherwise with
        every value the backward reads saved.
      status: ``"optimal"`` (no placement has a plan cheaper by more than
        ``autoremat._planner._search.OPTIMALITY_GAP``), or ``"feasible"`` when the time
        limit or the node limit stopped the solver (see ``gap``).
      gap: relative gap between the plan's recompute cost and the solver's lower bound.
      placement: where the remat regions are (:class:`autoremat.Placement`).
      solve_seconds: time spent in the solver.
      verified_peak_bytes: the device memory of the compiled step
        (:attr:`Measurement.peak_bytes`), when the plan was made with ``verify``
        (``None`` otherwise).
      verify_target: the target it was compiled for (``None`` without ``verify``).
      verify_compiles: how many compiles planning made (0 without ``verify``).
      graph: the traced value graph (not part of equality or hashing).
      offloaded: ids of the values offloaded to host memory (planned with ``offload``).
      offloaded_bytes: host bytes the offloaded values take.
      offload_flops: the modelled cost of their transfers, as FLOPs at the target's peak
        rate (see :class:`autoremat.OffloadConfig`).
      offload: the offload configuration the plan was made with (``None``: no offload).
      layout: how its bytes are counted: ``"dense"``, ``"tpu"`` or ``"tiled"`` (see
        :func:`plan`).
      no_remat: the plan recomputes nothing and runs the function as written: :meth:`apply`
        adds no checkpoint (whose barriers cost the compiler's fusion), ``saved_bytes`` are
        the residuals JAX keeps for the function itself and ``recompute_flops`` is 0.
        Without ``verify`` it also stands for a plan near no remat that the model puts
        within its error of the function as written, so its ``peak_bytes`` may then exceed
        ``budget_bytes`` (by less than 10% of the activation memory; the report says how
        far): see :func:`autoremat._planner._search.as_written_near_no_remat`.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> p = autoremat.plan(loss, w, x, budget="floor")
      >>> p.peak_bytes <= p.budget_bytes and p.overhead >= 0
      True
      >>> grads = jax.grad(p.apply(loss))(w, x)
      >>> print(p.report(max_rows=3).splitlines()[0])  # doctest: +ELLIPSIS
      budget ...
    """

    saved: frozenset[int]
    recomputed: frozenset[int]
    budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    recompute_flops: int
    step_flops: int
    no_remat_peak_bytes: int
    status: str
    gap: float
    placement: Placement
    solve_seconds: float = dataclasses.field(compare=False)
    graph: Graph = dataclasses.field(compare=False, repr=False)
    verified_peak_bytes: int | None = None
    verify_target: str | None = None
    verify_compiles: int = dataclasses.field(default=0, compare=False)
    offloaded: frozenset[int] = frozenset()
    offloaded_bytes: int = 0
    offload_flops: int = 0
    offload: OffloadConfig | None = None
    layout: Layout = "dense"
    no_remat: bool = False

    @property
    def actions(self) -> dict[int, str]:
        """What the plan does with each value it decides on, by value id: ``"save"``,
        ``"recompute"`` or ``"offload"``."""
        return {**dict.fromkeys(self.saved, "save"), **dict.fromkeys(self.recomputed, "recompute"),
                **dict.fromkeys(self.offloaded, "offload")}

    @property
    def overhead(self) -> float:
        """Recomputed FLOPs over the FLOPs of the step without remat."""
        return self.recompute_flops / max(1, self.step_flops)

    @property
    def modeled_overhead(self) -> float:
        """Recomputed FLOPs plus the offload cost (``offload_flops``) over the FLOPs of the
        step without remat: the modelled step-time overhead."""
        return (self.recompute_flops + self.offload_flops) / max(1, self.step_flops)

    @property
    def policy(self) -> Callable:
        """The ``jax.checkpoint`` policy that saves this plan's named values.

        It acts on the names :meth:`apply` places; use it with functions made by
        :meth:`apply`, never around them (the outer checkpoint policy would win).
        """
        return _program.policy_for(self.saved, self.offloaded)

    def apply(self, fn: Callable) -> Callable:
        """``fn`` rewritten to follow this plan (same signature, outputs and gradients).

        Raises:
          PlanMismatchError: when called with arguments whose program differs from the one
            the plan was made for.
        """
        if self.no_remat:
            return _rewrite.as_written(fn, self.graph.fingerprint)
        return _rewrite.rewrite(fn, self.saved, self.graph.fingerprint, self.placement,
                                self.offloaded)

    def report(self, max_rows: int = 40) -> str:
        """A readable table of the plan's decisions, largest first, with its totals."""
        return _report.report(self, max_rows=max_rows)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan to a policy file (JSON), for :func:`autoremat.load_plan` and
        ``autoremat report`` (:func:`autoremat.save_plan`)."""
        _policy_file.save_plan(self, path)

    def plot_memory(self, path: str | os.PathLike, *, title: str | None = None) -> None:
        """Draws the modelled memory in use at each region's forward and backward stage,
        this plan against no remat, with the budget (PNG or SVG by ``path``'s suffix;
        needs matplotlib: ``pip install "autoremat[plots]"``)."""
        _plots.memory_timeline(self, path, title=title)

    def maxtext_config(self) -> dict[str, str]:
        """What the plan does with each name the user's code gives tensors
        (:func:`jax.ad_checkpoint.checkpoint_name`), as MaxText's ``remat_policy: custom``
        states it: ``"device"``, ``"offload"`` or ``"remat"``, or ``"mixed"`` when the plan
        treats the name's tensors differently in different layers (see
        :mod:`autoremat._maxtext`)."""
        return _maxtext.config(self)

    def save_maxtext(self, path: str | os.PathLike) -> None:
        """Writes :meth:`maxtext_config` as a MaxText configuration (YAML with
        ``remat_policy: custom``); ``"mixed"`` names are written as ``remat``, with a comment.

        Raises:
          ValueError: no tensor of the function carries a name.
        """
        _maxtext.write(self, path)

    @property
    def name_policy(self) -> Callable:
        """The ``jax.checkpoint`` policy over the user's own names that
        :meth:`maxtext_config` states: ``save_only_these_names`` of its ``"device"`` names
        (and ``save_and_offload_only_these_names`` when some are ``"offload"``).

        Use it around the user's layers instead of :meth:`apply`. It keeps what the plan
        keeps when the plan keeps named tensors only and treats each name alike in every
        layer; otherwise it approximates the plan.
        """
        return _maxtext.name_policy(self)
