"""How to plan: every keyword of :func:`autoremat.plan` but the budget, as one record."""

from __future__ import annotations

import dataclasses
from typing import Literal

from autoremat_ilp import Progress

from autoremat import _layout, _measure
from autoremat._layout import Layout
from autoremat._offload import OffloadConfig
from autoremat._op_times import OpTimes

BACKENDS = ("HIGHS", "SCIP", "CBC")
#: ``verify``'s default: the compiler of this process's accelerator, if it has one.
AUTO = "auto"
#: ``node_limit``'s default: branch-and-bound nodes per solve (see ``plan``).
NODE_LIMIT = 1000
#: ``layout``'s accepted values: a layout, or ``"auto"``, that of the ``verify`` target.
LAYOUT_CHOICES = (*_layout.LAYOUTS, AUTO)


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """The planning options :func:`autoremat.plan`, :func:`autoremat.optimize`, the command
    line and the benchmark share (see :func:`autoremat.plan` for each).

    Built once from the keywords of the entry point and passed whole down the stages, so
    that no entry point can drift from another.

    Attributes:
      time_limit_s: stop planning after about this long with the best plan found.
      node_limit: the most branch-and-bound nodes of each solve (``None``: no limit), which
        stops a search at the same plan on any machine, unlike the time limit.
      backends: MIP backends tried in turn, from :data:`BACKENDS` (HiGHS alone by default:
        with SCIP after it, no plan measured came out cheaper and some slower,
        ``bench/results/planning-time-backends/planning_time.md``).
      verify: the compiler target of the closed loop (``"tpu-v5e"``, ``"tpu"``, ...), or
        ``None``; ``"auto"`` (default) is resolved on construction to this process's
        accelerator (:func:`autoremat.local_target`: ``None`` on a CPU).
      verify_rounds: the most compiles before a plan fits.
      refine_rounds: the most compiles spent on cheaper plans once one fits. Each
        solves where the straight line through the model's and the compiler's peaks of
        the best plan and of the plan just above it that did not fit meets the budget
        (less 1% of it), where a plan did not fit; else by the placement's errors. One
        more where the plan that fit leaves more than a tenth of the budget unused while
        recomputing more than a tenth of the step.
      offload: an :class:`autoremat.OffloadConfig`, or ``None`` for no offload.
      progress: ``progress(elapsed_s, best, bound)``, called while the solver searches.
      op_times: measured operation times (:func:`autoremat.measure_op_times`), or
        ``None`` to cost recompute in FLOPs.
      layout: ``"dense"``, ``"tpu"`` or ``"tiled"``: how a value's bytes are counted;
        ``"auto"`` (default): the layout of the ``verify`` target
        (:attr:`resolved_layout`: ``"tiled"`` for a TPU, else ``"dense"``).
      nested_scans, nested_segments: also consider nested scans, nested segments.

    Example:
      >>> import autoremat
      >>> options = autoremat.PlanOptions(verify="tpu-v5e", refine_rounds=2)
      >>> options.verify_rounds
      4

    Raises:
      ValueError: an option is out of range (``layout`` not one of
        :data:`LAYOUT_CHOICES`, a backend not one of :data:`BACKENDS`,
        ``verify_rounds`` below 1, ``refine_rounds`` below 0, a time limit or a node limit
        not positive).
    """

    time_limit_s: float = 60.0
    node_limit: int | None = NODE_LIMIT
    backends: tuple[str, ...] = ("HIGHS",)
    verify: str | None = AUTO
    verify_rounds: int = 4
    refine_rounds: int = 0
    offload: OffloadConfig | None = None
    progress: Progress | None = dataclasses.field(default=None, compare=False)
    op_times: OpTimes | None = None
    layout: Layout | Literal["auto"] = AUTO
    nested_scans: bool = False
    nested_segments: bool = False

    def __post_init__(self) -> None:
        _layout.check(self.layout, LAYOUT_CHOICES)
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be positive, not {self.time_limit_s!r}.")
        if self.node_limit is not None and not self.node_limit >= 1:
            raise ValueError(f"node_limit must be 1 or more (or None), not {self.node_limit!r}.")
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"backends {tuple(self.backends)!r}: choose from {BACKENDS}.")
        if self.verify_rounds < 1:
            raise ValueError(f"verify_rounds must be 1 or more, not {self.verify_rounds!r}.")
        if self.refine_rounds < 0:
            raise ValueError(f"refine_rounds must be 0 or more, not {self.refine_rounds!r}.")
        object.__setattr__(self, "backends", tuple(self.backends))
        if self.verify == AUTO:
            object.__setattr__(self, "verify", _measure.local_target())

    @property
    def resolved_layout(self) -> Layout:
        """The layout values are counted in: ``layout``, or for ``"auto"`` that of the
        ``verify`` target (also after ``dataclasses.replace`` gives another target)."""
        return _layout.of_target(self.verify) if self.layout == AUTO else self.layout
