"""bench/fidelity.py: its rows hold what the compiler reports, and its summary reads them."""

from __future__ import annotations

import json

from bench import fidelity


def test_rows_and_summary(tmp_path):
    name = "eqx-mlp-tiny"
    fidelity.plan_rows(name, tmp_path)
    rows = json.loads((tmp_path / "plans" / f"{name}.json").read_text())
    assert [r["kind"] for r in rows] == ["as written", "floor", "budget", "budget", "budget"]
    for r in rows:
        assert r["arguments_outputs"] <= r["device"]
        assert r["without_working_sets"] <= r["predicted"]
    budget = rows[-2]["budget"]
    fidelity.verify_row(name, budget, tmp_path)
    verified = json.loads((tmp_path / "verify" / f"{name}-{budget}.json").read_text())
    assert verified["device"] <= budget and verified["compiles"] >= 1
    text = fidelity.summary(tmp_path)
    assert f"| {name} | floor |" in text and "compiles per verified budget: mean" in text
