"""``autoremat.plan(..., progress=...)``: the solver's best plan and bound while it solves."""

from __future__ import annotations

import math

import pytest

import autoremat
from autoremat import zoo


def test_plan_reports_the_solvers_progress_and_makes_the_same_plan():
    model = zoo.get("gpt2-small-tiny")
    loss, args = model.make_loss(), (model.param_shapes(), model.batch_shapes())
    calls = []
    plan = autoremat.plan(loss, *args, budget=0.5, progress=lambda *a: calls.append(a))
    assert plan == autoremat.plan(loss, *args, budget=0.5)
    assert plan.recompute_flops > 0
    for elapsed, best, bound in calls:
        assert elapsed >= 0 and math.isfinite(best) and best >= bound
    # The objective is the recomputed FLOPs and small tie-breaks (see autoremat._solve),
    # and the plan the cheapest of every placement's: no dearer than any plan reported
    # (a placement whose solve ends in presolve reports none).
    assert plan.recompute_flops <= min(best for _, best, _ in calls) < plan.step_flops
    assert len({best for _, best, _ in calls}) > 2  # HiGHS reports better plans as found


def test_an_exception_in_progress_stops_planning():
    model = zoo.get("gpt2-small-tiny")

    def stop(*_):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        autoremat.plan(model.make_loss(), model.param_shapes(), model.batch_shapes(),
                       budget=0.5, progress=stop)
