"""bench/on_chip.py's ahead-of-time stage: the plans it saves load as they were verified."""

from __future__ import annotations

import autoremat
from autoremat import _measure
from bench import corpus, on_chip


def test_saved_plans_load_and_compile_at_their_verified_peaks(tmp_path):
    name = "eqx-mlp-tiny"
    row = on_chip.plan_model(name, "tpu-v5e", tmp_path)
    model = corpus.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    loss = model.make_loss()
    for key in on_chip.PLANS:
        plan = autoremat.load_plan(tmp_path / f"{name}.{key}.json", loss, *args)
        peak = _measure.measure_step(plan.apply(loss), *args, target="tpu-v5e",
                                     argnums=_measure.float_argnums(args)).peak_bytes
        assert peak == plan.verified_peak_bytes == row[key]["aot"] <= plan.budget_bytes
    assert row["at-hand"]["budget"] == row["hand"]
