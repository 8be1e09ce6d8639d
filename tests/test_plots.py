"""The memory-over-time picture of a plan."""

from __future__ import annotations

import numpy as np
import pytest

import autoremat
from autoremat import _plots
from tests.models import MODELS

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module", params=["mlp", "gpt2_scanned"])
def plan(request):
    loss, args = MODELS[request.param]()
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1)
    top = autoremat.plan(loss, *args, budget=1.0).budget_bytes
    return autoremat.plan(loss, *args, budget=(info.value.floor_bytes + top) // 2)


def test_stages_are_forward_then_backward_and_peak_where_the_plan_says(plan):
    labels, planned, baseline = _plots.memory_stages(plan)
    regions = plan.graph.regions
    assert len(labels) == len(planned) == len(baseline) == 2 * len(regions)
    assert [s[0] for s in labels] == ["F"] * len(regions) + ["B"] * len(regions)
    assert labels[len(regions):] == ["B" + s[1:] for s in reversed(labels[:len(regions)])]
    for r in regions:
        if r.kind == "scan":
            assert labels[r.index].endswith(f"×{r.length}")
    assert int(planned.max()) == plan.peak_bytes <= plan.budget_bytes
    assert int(baseline.max()) == plan.no_remat_peak_bytes > plan.budget_bytes
    assert np.all(planned <= baseline)
    # Arguments and gradients are held at the last backward stage whatever the plan.
    assert planned[-1] >= plan.graph.fixed_bytes


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_files_by_suffix(plan, tmp_path, suffix):
    path = tmp_path / f"memory{suffix}"
    plan.plot_memory(path)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]
    _plots.memory_timeline(plan, tmp_path / f"again{suffix}", title="custom")
    assert (tmp_path / f"again{suffix}").stat().st_size > 0
