"""Stage 4, with ``verify``: the closed loop against the real compiler.

Each round plans for the model's budget less a margin per placement, compiles the plan,
and learns from the compiler's peak. Each rule is a method of :class:`ClosedLoop`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from autoremat._budget import FLOOR, Budget, format_bytes
from autoremat._errors import BudgetNotVerifiedError, InfeasibleBudgetError, SolverTimeoutError
from autoremat._placement import Placement
from autoremat._plan import Plan
from autoremat._planner._candidates import near_no_remat
from autoremat._planner._search import Margins

# Lowered a little past the measured excess, so the next plan does not land on the edge.
MARGIN_BYTES = 2**20

# A plan that fits with more than this part of the budget unused, where the model put
# every cheaper plan above the budget, shows the model too high on this program (on CNNs
# it puts the function as written at 2.4x the compiler's peak): the function as written is
# compiled too.
ROOM_LEFT = 0.1

# A plan that fits recomputing at most this part of the step is compared with the function
# as written, compiled once: one compile costs less than that recompute on every step of a
# run, and the model can put the function as written far above the compiler, whatever the
# plan's (a Flax Linen CNN: a plan recomputing 7.5% compiled at 154 MiB, as the function as
# written did, which the model put at 303 MiB).
LITTLE_RECOMPUTE = 0.1

# The secant of a refining round aims this part of the budget under it: the compiler's
# peak moves in steps.
SECANT_AIM = 0.01


def decisions(p: Plan) -> tuple:
    """What a plan decides, to tell whether it was compiled already."""
    return (p.placement, p.saved, p.recomputed, p.offloaded)


def recompute_cost(p: Plan) -> int:
    """What a plan adds to the step: its recomputed FLOPs and its offloads' cost."""
    return p.recompute_flops + p.offload_flops


@dataclasses.dataclass
class ClosedLoop:
    """The closed loop's state between rounds.

    Attributes:
      solve: the plan for a model budget (bytes, or ``"floor"``) under margins.
      compiled_peak: the compiler's peak of a plan's step (one compile).
      target: the compiler target (``Plan.verify_target`` of the result).
      verify_rounds, refine_rounds: compiles before a plan fits, and after.
      margins: per placement, how far below the budget its plans are solved (the model's
        error on the compiler differs between placements).
      unknown_margin: the margin of placements not compiled yet: the largest excess of the
        compiler's peak over the model's seen so far, so that a round does not pick the
        placement whose error is still unknown.
      errors: per placement, the largest compiler peak less the model's.
      budget_bytes: the budget the compiler's peak must fit (set by the first round).
      lowest_peak: the lowest compiler peak of the plans compiled so far.
      best: the plan that fit with the least recompute.
      tries, refines: compiles before a plan fit, and after.
      compiled: the decisions compiled so far.
      fallbacks: the plans compiled with the model's floor plan, in order of recompute
        up to the first that fits, below the model's floor or when no round's plan fit,
        since the model's error differs between them (the floor plans of the placements
        near the least, then the plans a user tries by hand:
        :func:`autoremat._planner._candidates.obvious_plans`; each compiled once, the
        floor plan among them too): the contenders of :func:`verified_floor`, so that a
        budget at the verified floor fits whichever of them the floor plan is (under a
        time limit, a solve may differ from one call to the next).
      no_remat: the plan that recomputes nothing (the function as written where it can
        be: :func:`autoremat._planner._candidates.as_written_plan`), of the model's
        no-remat peak (``Plan.no_remat_peak_bytes``, which it reports), compiled once a plan
        that recomputes fits where a plan compiled recomputes at most ``NEAR_NO_REMAT`` of
        the step, or leaves more than ``ROOM_LEFT`` of the budget unused, or fits below
        the model's floor: nothing recomputes less, and the compiler may fit it.
      near_no_remat: a plan compiled so far recomputes at most ``NEAR_NO_REMAT``.
      below_model_floor: the budget is below the model's floor, which is then too high
        on this program (Keras's CNN on TPU v5e: its floor plan, recomputing 30%, and the
        function as written both compile at the 11.9 MiB of arguments and outputs, the
        chip keeping every temporary on-chip).
      over: the model's and the compiler's peaks of each round's plan that did not fit.
      solve_nesting: the plan for a model budget under margins over the placements
        ``fallbacks`` come from, nested ones included; the refining rounds after a nested
        fallback fit solve with it (``None``: with ``solve``).
      by_hand: the plans of one remat per layer
        (:func:`autoremat._planner._candidates.per_layer_plan`), of the model's no-remat
        peak (the argument, as for ``no_remat``), each compiled once a plan
        fits where it recomputes less than that plan and the model's errors so far allow
        it to fit: the model can put a plan that recomputes more under the one a user
        writes by hand while the compiler fits both (a Flax Linen CNN at 140.9 MiB: a plan
        recomputing 33.13% compiled at 124.3 MiB, where its hand baseline, recomputing
        32.97%, fits at 128.1 MiB).
    """

    solve: Callable[[Budget, Margins], Plan]
    compiled_peak: Callable[[Plan], int]
    target: str
    verify_rounds: int
    refine_rounds: int
    margins: dict[Placement, int] = dataclasses.field(default_factory=dict)
    unknown_margin: int = 0
    errors: dict[Placement, int] = dataclasses.field(default_factory=dict)
    budget_bytes: int | None = None
    lowest_peak: int | None = None
    best: Plan | None = None
    tries: int = 0
    refines: int = 0
    compiled: set[tuple] = dataclasses.field(default_factory=set)
    fallbacks: Callable[[], Sequence[Plan]] = tuple
    no_remat: Callable[[int], Plan] | None = None
    near_no_remat: bool = False
    below_model_floor: bool = False
    by_hand: Callable[[int], Sequence[Plan]] = lambda _: ()
    solve_nesting: Callable[[Budget, Margins], Plan] | None = None
    over: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def run(self, budget: Budget) -> Plan:
        """A plan whose compiler peak fits ``budget``: the cheapest found within the rounds.

        When ``verify_rounds`` compiles fit nothing, the model's floor plan and the
        ``fallbacks`` are compiled in order of recompute before giving up (the model's
        plans near its floor may all compile above a budget that the verified floor
        fits).

        Raises:
          InfeasibleBudgetError: the budget is below the model's floor, and neither its
            floor plan nor a fallback fits on the compiler.
          BudgetNotVerifiedError: no plan fit within ``verify_rounds`` compiles, nor the
            floor plan or a fallback after them.
        """
        model_budget = budget
        while self.rounds_left():
            round_ = self.plan_round(model_budget)
            if round_ is None:
                break
            plan, peak = round_
            assert self.budget_bytes is not None  # set by the round
            if peak <= self.budget_bytes:
                self.fitted(plan, peak)
            else:
                self.exceeded(plan, peak)
                if self.best is None and self.near_no_remat:
                    self.without_remat(plan.no_remat_peak_bytes)
            model_budget = self.budget_bytes
        if self.best is None:
            self.after_the_rounds()
        else:
            self.cheaper_by_hand()
        assert self.best is not None  # fitted, or raised above
        if recompute_cost(self.best) > 0 and (self.near_no_remat or self.room_left()
                                                or self.below_model_floor
                                                or self.best.modeled_overhead <= LITTLE_RECOMPUTE):
            self.without_remat(self.best.no_remat_peak_bytes)
        return dataclasses.replace(self.best, verify_compiles=self.tries + self.refines)

    def after_the_rounds(self) -> None:
        """No plan of the rounds fit: the plan under twice the largest error
        (:meth:`under_twice_the_error`) is the best where it fits; else, of the model's
        floor plan and the ``fallbacks``, the one recomputing least that fits.

        Raises:
          BudgetNotVerifiedError: none fits; the lowest compiler peak seen is the smallest
            budget known to fit.
        """
        # A round ran (verify_rounds >= 1) and set both.
        assert self.budget_bytes is not None and self.lowest_peak is not None
        rounds = self.tries
        self.under_twice_the_error()
        if self.best is not None:
            return
        try:
            plan, peak = self._below_the_floor(self.solve(FLOOR, Margins()))
        except InfeasibleBudgetError as e:
            raise BudgetNotVerifiedError(
                self.budget_bytes, e.floor_bytes,
                f"after {rounds} compiles for {self.target}, and the floor plans and the "
                f"obvious plans after them, no plan fits a budget of "
                f"{format_bytes(self.budget_bytes)}: the lowest compiled peaks at "
                f"{format_bytes(e.floor_bytes)}. Ask for that budget or more.") from None
        self.fitted(plan, peak)

    def under_twice_the_error(self) -> None:
        """Above the model's floor, the plan for the budget less twice the largest excess
        of the compiler's peak over the model's seen in the rounds is compiled, and kept
        where it fits: the model's error can differ several times over between plans of
        one placement, the compiler's peak not monotone in the model's (a Llama-style
        decoder of 12 unrolled layers at 3870 MiB on TPU v5e: four plans the model put at
        3590 to 3844 MiB compiled 94 to 396 MiB above it; the floor plan after them fit,
        recomputing 19.1%)."""
        assert self.budget_bytes is not None  # set by the rounds
        error = max(self.errors.values())
        budget = self.budget_bytes - 2 * error - MARGIN_BYTES
        if self.below_model_floor or error <= 0 or budget <= 0:
            return
        try:
            plan = self.solve(budget, Margins())
        except (InfeasibleBudgetError, SolverTimeoutError):  # the floor plan comes next
            return
        self.compile_once(plan)

    def cheaper_by_hand(self) -> None:
        """Each plan of ``by_hand`` that recomputes less than the best is compiled, where
        the model puts it at most the budget plus the lowest error seen (the compiler's
        peak less the model's), and is the best where it fits."""
        assert self.budget_bytes is not None and self.best is not None  # a plan fit
        for plan in self.by_hand(self.best.no_remat_peak_bytes):
            if (recompute_cost(plan) < recompute_cost(self.best)
                    and plan.peak_bytes + min(self.errors.values()) <= self.budget_bytes):
                self.compile_once(plan)

    def compile_once(self, plan: Plan) -> None:
        """Compiles ``plan`` unless it was already, and keeps it where it fits."""
        assert self.budget_bytes is not None  # set by the rounds
        peak = self.compile_new(plan)
        if peak is not None and peak <= self.budget_bytes:
            self.fitted(plan, peak)

    def compile_new(self, plan: Plan) -> int | None:
        """The compiler's peak of ``plan``, learnt; ``None`` where it was compiled already
        (in a round, or as a fallback)."""
        decided = decisions(plan)
        if decided in self.compiled:
            return None
        self.compiled.add(decided)
        peak = self.compiled_peak(plan)
        self.learn(plan, peak)
        return peak

    def room_left(self) -> bool:
        """The best plan's compiler peak leaves more than ``ROOM_LEFT`` of the budget
        unused."""
        assert self.budget_bytes is not None and self.best is not None  # set by the rounds
        assert self.best.verified_peak_bytes is not None  # set when it fit
        return self.best.verified_peak_bytes < (1 - ROOM_LEFT) * self.budget_bytes

    def without_remat(self, no_remat_peak: int) -> None:
        """A plan compiled recomputes at most ``NEAR_NO_REMAT`` of the step (whether it
        fit or not: the model's plans near no remat may compile far above it, and the
        function as written is then tried at once when none fit yet), or the best
        recomputes at most ``LITTLE_RECOMPUTE`` or leaves more than ``ROOM_LEFT`` of the
        budget unused: the plan that recomputes nothing
        (``no_remat_peak``: its modelled peak) is the best instead where it fits."""
        if self.no_remat is not None:
            self.compile_once(self.no_remat(no_remat_peak))

    def rounds_left(self) -> bool:
        """Compiles are left: ``verify_rounds`` until a plan fits, ``refine_rounds`` after,
        and one more where the best is :meth:`worth_refining`."""
        if self.best is None:
            return self.tries < self.verify_rounds
        return self.refines < self.refine_rounds + self.worth_refining()

    def worth_refining(self) -> bool:
        """The best leaves more than ``ROOM_LEFT`` of the budget unused while recomputing
        more than ``LITTLE_RECOMPUTE`` of the step: the compiler came out far below the
        model, and a round solved by that error recomputes less (penzai's ``LayerStack``
        Llama at 204 MiB on TPU v5e: a plan the model put at 200.5 MiB, recomputing 18.4%,
        compiled at 126.1)."""
        assert self.best is not None
        return self.room_left() and self.best.modeled_overhead > LITTLE_RECOMPUTE

    def next_solve(self, model_budget: Budget) -> tuple[Budget, Margins]:
        """The next round's model budget and margins: while refining, the secant's
        (:meth:`secant_budget`) under no margin where it has one, else ``model_budget``
        under each placement's margin."""
        target = self.secant_budget()
        if target is not None:
            return target, Margins()
        return model_budget, Margins(dict(self.margins), self.unknown_margin)

    def secant_budget(self) -> int | None:
        """Once a plan fits: the model's peak at which the straight line through the
        best's model and compiler peaks and those of the round's plan just above it that
        did not fit (the least model peak above the best's) meets the budget less
        ``SECANT_AIM`` of it; ``None`` before a fit, without such a plan, or where the
        line meets it at or below the best's model peak. It refines by the compiler's
        peaks of two plans instead of by the largest error of one placement, which the
        plan above may have set far higher than the best's (the zoo's MLP at 1327 MiB on
        TPU v5e: 1479.6 MiB compiled for a plan the model put at 1321.0, then 1233.4 for
        one at 1165.1 recomputing 13.5%; by that error a refining round solved the same
        plan again, by the secant it gets one at 1308.9 recomputing 12.0%)."""
        if self.best is None or recompute_cost(self.best) == 0:
            return None
        assert self.budget_bytes is not None and self.best.verified_peak_bytes is not None
        low, low_peak = self.best.peak_bytes, self.best.verified_peak_bytes
        above = [(m, p) for m, p in self.over if m > low and p > low_peak]
        if not above:
            return None
        high, high_peak = min(above)
        aim = self.budget_bytes * (1 - SECANT_AIM)
        target = int(low + (aim - low_peak) * (high - low) / (high_peak - low_peak))
        return target if target > low else None

    def plan_round(self, model_budget: Budget) -> tuple[Plan, int] | None:
        """This round's plan (solved as :meth:`next_solve` says) and its compiler peak;
        ``None`` when refining has nothing cheaper left to try (or the model has no plan
        for the budget any more, or the solver's time limit passed before it found one).

        Below the model's floor, its floor plan (the one keeping the most room) or one of
        the ``fallbacks`` may still fit on the compiler (the one recomputing least that
        fits is this round's; those compiled before it are counted as tries). Since the
        compiler's peak is not monotone in the model's, a plan compiled in an earlier round
        may have come out lower, and the floor reported is the lowest compiled.
        """
        solve = self.solve
        if self.best is not None and self.best.placement.nests and self.solve_nesting:
            solve = self.solve_nesting
        try:
            plan = solve(*self.next_solve(model_budget))
        except SolverTimeoutError:
            if self.best is not None:  # refining: the plan that fit stands
                return None
            raise
        except InfeasibleBudgetError as e:
            if self.best is not None:
                return None
            self.budget_bytes = self.budget_bytes or e.budget_bytes
            self.below_model_floor = True
            return self._below_the_floor(self.solve(FLOOR, Margins()))
        self.budget_bytes = self.budget_bytes or plan.budget_bytes
        decided = decisions(plan)
        if self.best is not None and (decided in self.compiled or
                                      recompute_cost(plan) >= recompute_cost(self.best)):
            return None
        self.compiled.add(decided)
        peak = self.compiled_peak(plan)
        self.learn(plan, peak)
        return plan, peak

    def _below_the_floor(self, floor: Plan) -> tuple[Plan, int]:
        """Of the model's ``floor`` plan and the ``fallbacks``, the one recomputing least
        that fits on the compiler, and its peak: they are compiled in order of recompute up
        to the first that fits. Below the model's floor its error differs most between
        plans (a Flax NNX transformer at 106 MiB on TPU v5e: its nested floor, recomputing
        30.5%, fits, and so does one remat per layer with the code around the layers in
        checkpoints too, recomputing 25.4%; its floor plan does not). A plan compiled
        already (in a round) is not compiled again.

        Raises:
          InfeasibleBudgetError: none fits; the lowest compiler peak seen is the floor.
        """
        assert self.budget_bytes is not None  # set by the caller
        fit = self._first_fitting(sorted([floor, *self.fallbacks()], key=recompute_cost))
        if fit is None:
            assert self.lowest_peak is not None  # learnt above
            raise InfeasibleBudgetError(self.budget_bytes, self.lowest_peak) from None
        return fit

    def _first_fitting(self, plans: Iterable[Plan]) -> tuple[Plan, int] | None:
        """The first of ``plans`` not compiled yet that fits the budget, and its peak;
        each compiled up to it."""
        assert self.budget_bytes is not None  # set by the caller
        for plan in plans:
            peak = self.compile_new(plan)
            if peak is not None and peak <= self.budget_bytes:
                return plan, peak
        return None

    def learn(self, plan: Plan, peak: int) -> None:
        """Counts the compile and records the compiler's error on the plan's placement."""
        self.near_no_remat |= near_no_remat(plan)
        if self.best is None:
            self.tries += 1
        else:
            self.refines += 1
        self.lowest_peak = min(peak, self.lowest_peak or peak)
        error = peak - plan.peak_bytes
        self.errors[plan.placement] = max(self.errors.get(plan.placement, error), error)

    def fitted(self, plan: Plan, peak: int) -> None:
        """A plan fit: kept if cheapest so far; then each placement is solved again for the
        budget its errors so far allow (looser where the compiler came out below the
        model), those not compiled by the largest error seen."""
        if self.best is None or recompute_cost(plan) < recompute_cost(self.best):
            self.best = dataclasses.replace(plan, budget_bytes=self.budget_bytes,
                                            verified_peak_bytes=peak, verify_target=self.target)
        self.margins[plan.placement] = self.errors[plan.placement] + MARGIN_BYTES
        self.unknown_margin = max(self.errors.values()) + MARGIN_BYTES

    def exceeded(self, plan: Plan, peak: int) -> None:
        """A plan did not fit: its placement is solved lower by the excess but at least
        0.5% of the budget, more each round (the compiler's peak moves in steps: a plan a
        few MiB lower can come out the same), and at least by as much as the compiler's
        peak exceeded the model's for it. While refining, a margin loosened too far is
        taken halfway back to what the placement's largest error allows."""
        assert self.budget_bytes is not None  # set by the round that compiled plan
        self.over.append((plan.peak_bytes, peak))
        key, error = plan.placement, self.errors[plan.placement]
        used = self.margins.get(key, self.unknown_margin) + (self.budget_bytes
                                                             - plan.budget_bytes)
        self.unknown_margin = max(self.unknown_margin, error + MARGIN_BYTES)
        if self.best is not None and used < error:
            self.margins[key] = (used + error + MARGIN_BYTES) // 2
            return
        rounds = self.tries if self.best is None else self.refines
        step = rounds * max(peak - self.budget_bytes, self.budget_bytes // 200)
        self.margins[key] = max(used + step, error) + MARGIN_BYTES


def verified_floor(floors: Sequence[Plan], compiled_peak: Callable[[Plan], int], target: str
                   ) -> Plan:
    """Of the plans ``floors`` (the floor plans of the placements, the model's error
    differing between them, and the obvious plans of
    :func:`autoremat._planner._candidates.obvious_plans`), the one the compiler puts
    lowest, on a tie the one that recomputes least, then the earlier (several can hold
    only the step's arguments and outputs): a verified floor is never above no remat, or
    above one remat per layer, on the compiler."""
    peak, _, k = min((compiled_peak(p), p.recompute_flops, k) for k, p in enumerate(floors))
    return dataclasses.replace(floors[k], budget_bytes=max(floors[k].budget_bytes, peak),
                               verified_peak_bytes=peak, verify_target=target,
                               verify_compiles=len(floors))
