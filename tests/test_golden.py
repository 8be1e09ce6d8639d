"""Plan digests of every zoo ``-tiny`` model at three budgets, frozen before a refactor.

The digests in ``tests/golden/plans.json`` were first written by this module's
``__main__`` on the code before the redesign (commit 7583ea8), and written again when the
placements from the program's structure (``layer_cuts``) changed the plans on purpose:
no floor went up (resnet-tiny's fell 39.7%, unet-tiny's nested one 2.7%). Written again
when the last layer ends a layer's length after its start (``_last_layer_end``):
mlp-tiny's last cut moved by one equation, resnet-tiny's floor rose 2.1%, unet-tiny's
fell 13.0% (nested 13.1%). Written again when saved values share only the gradients'
buffers they fit in (``Graph.reserved_room``): no floor changed; unet-tiny's recompute
at a third and two thirds rose 1.0% and 2.4%, the other changes are within the
solver's gap. Written again when calls of elementwise ops fuse (``jax.nn.relu``) and a
block's output is freed after the next block's backward (``Value.released``): the model's
peaks fell up to 14.1% (resnet-tiny's floor), one placement moved (llama-tiny at two
thirds, same peak and recompute). Written again when no remat's peak became the one
the compiler gives the function as written, elementwise chains fused into the backward
(``_solve.as_written``): no floor changed; the budgets a third and two thirds of the
way to no remat fell with it (0.6-46% lower peaks, more recompute). Written again when a
gradient's buffer holds one saved value at a time (``Graph.reserved_room``'s caps):
resnet-tiny's floor rose 2.7% and gpt2-small-tiny's floor recompute 30.2% at the same
peak; the rest moved within 1.7% (no placement changed). Written again when one remat
per layer is the floor where the model puts the solved floor less than its error under
it (``_candidates.per_layer_floor``): the floors of gpt2-small-scan-tiny (also nested),
llama-tiny and mlp-tiny are that plan, up to 0.12% above the solved floor (not solved,
so ``"feasible"``), and the budgets a third and two thirds of the way from them moved
with them. Written again when a block that runs its code twice (the U-Net's double
convolution) is one layer per call (``_trace._boundaries._calls``): unet-tiny's floor fell
10.1% (nested 4.5%), its budgets a third and two thirds of the way from it moved with it.
Written again when one remat per layer passes no input barrier (``Placement.barriers``):
the floors of gpt2-small-scan-tiny (also nested), llama-tiny and mlp-tiny, that plan, have
``"barriers": false`` in their placements; no figure changed.
Written again when one remat per layer is weighed against the solved floors where no saved
value shares the gradients' buffers (``_candidates.unshared_peak``): the floors of
gpt2-small-tiny, llama-unrolled-tiny (also nested), unet-tiny (also nested) and
resnet-tiny are one remat per layer, modelled 0.7-12% above the solved floors; compiled
for TPU v5e, gpt2-small-tiny's floor fell from 4.42 to 3.57 MB and llama-unrolled-tiny's
from 3.68 to 3.09 (each its hand baseline's), unet-tiny's rose from 4.03 to 5.23 (its hand
baseline: 5.11), resnet-tiny's is the same 3.47; the budgets a third and two thirds of the
way from them moved with them. Written again when a placement solved after another has a
plan is searched only for plans cheaper by more than ``_search.OPTIMALITY_GAP``:
llama-tiny at two thirds is the first placement's plan (no cuts), of the same peak and
recompute as the later placement's it was. Written again when each placement is solved to
that relative gap (it was 1e-4), the least LP bound first: unet-tiny (also nested) at a
third and two thirds recomputes 0.02% more at 0.02-0.03% lower peaks; gpt2-small-scan-tiny
at two thirds, gpt2-small-tiny at a third and llama-unrolled-tiny (also nested) at two
thirds save other values of the same peak and recompute. Written again when a saved value
larger than every gradient buffer of a capped bound counts whole in it
(``Graph.reserved_room``'s ``fits``): unet-tiny (also nested) at a third and two thirds
recomputes 1.3% and 4.1% less at 0.07% and 0.2% lower peaks; nothing else changed.
Written again when HiGHS runs its light presolve (``autoremat_ilp.milp._PRESOLVE_MODE``)
and a solve's first MILP has the lazy bounds its start holds near the budget
(``autoremat_ilp.portfolio.TIGHT_SHARE``): no floor and no placement changed; at a third
and two thirds, eleven plans moved within the gap (up to 96 FLOPs, peaks up to 64 bytes
either way), and llama-unrolled-tiny at a third and unet-tiny at a third and two thirds
(also nested) recompute 2.4-5.4% more FLOPs at the same peak: ties of the solver's cost,
which counts the elements a copy or reshape moves beside FLOPs (on llama-unrolled-tiny,
the same MILP objective to the last digit).
The test checks the current code gives the same plans: the saved set, the placement, the
predicted peak, the recompute and the solver's status.
Regenerate (only when a change of plans is intended) with ``python -m tests.test_golden``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pathlib

import pytest

import autoremat
from autoremat import zoo
from autoremat._planner import _search

GOLDEN = pathlib.Path(__file__).parent / "golden" / "plans.json"
MODELS = sorted(name for name in zoo.ZOO if name.endswith("-tiny"))
# The floor, and a third and two thirds of the way from the floor to no remat.
BUDGETS = ("floor", "1/3", "2/3")
# Nested placements, off by default: (model, option) pairs planned at every budget too.
NESTED = (("gpt2-small-scan-tiny", "nested_scans"), ("unet-tiny", "nested_segments"),
          ("llama-unrolled-tiny", "nested_segments"))
CASES = [(m, b, "") for m in MODELS for b in BUDGETS] + [
    (m, b, option) for m, option in NESTED for b in BUDGETS]


@functools.cache
def _plan(model: str, budget: str | int, option: str) -> autoremat.Plan:
    m = zoo.get(model)
    options = {option: True} if option else {}
    return autoremat.plan(m.make_loss(), m.param_shapes(), m.batch_shapes(), budget=budget,
                          **options)


def digest(model: str, budget: str, option: str = "") -> dict:
    """What identifies the plan for ``model`` at ``budget`` (with ``option`` on)."""
    p = _plan(model, "floor", option)
    if budget != "floor":
        share = {"1/3": 1 / 3, "2/3": 2 / 3}[budget]
        p = _plan(model, p.peak_bytes + int(share * (p.no_remat_peak_bytes - p.peak_bytes)),
                  option)
    saved = ",".join(map(str, sorted(p.saved)))
    return {
        "saved": hashlib.sha256(saved.encode()).hexdigest()[:16],
        "num_saved": len(p.saved),
        "placement": placement_of(p),
        "peak_bytes": p.peak_bytes,
        "recompute_flops": p.recompute_flops,
        "status": p.status,
    }


def placement_of(p: autoremat.Plan) -> dict:
    """The placement as plain JSON."""
    return p.placement.to_json()


def _key(model: str, budget: str, option: str) -> str:
    return f"{model}@{budget}" + (f"+{option}" if option else "")


def _proven() -> list[tuple[str, str, str]]:
    """The cases whose golden plan the solver proved optimal, or which no solver made (one
    remat per layer, the code around the layers as written: ``written`` regions). A plan
    the time limit stopped (``"feasible"``: llama-unrolled-tiny at two thirds, about a
    minute of HiGHS) depends on the machine's load, so it is no fixed point to compare
    with."""
    golden = json.loads(GOLDEN.read_text())
    return [c for c in CASES if golden[_key(*c)]["status"] == "optimal"
            or golden[_key(*c)]["placement"].get("written")]


@pytest.mark.parametrize(("model", "budget", "option"), _proven(),
                         ids=[_key(*c) for c in _proven()])
def test_plan_unchanged(model, budget, option):
    expected = json.loads(GOLDEN.read_text())[_key(model, budget, option)]
    got = digest(model, budget, option)
    if got != expected:
        # HiGHS proves optimality within a relative gap (OPTIMALITY_GAP), and which of the
        # plans within it it returns depends on the time limit it is given (the time
        # planning has left: gpt2-small-tiny at two thirds gives 126980 recompute FLOPs
        # with the default limit, 126976 with 600 s, on the code before the redesign too).
        # Another proven plan within the gap, at the same placement, is the same answer.
        assert got["placement"] == expected["placement"]
        assert got["status"] == expected["status"] == "optimal"
        assert abs(got["recompute_flops"] - expected["recompute_flops"]) <= max(
            1, _search.OPTIMALITY_GAP * expected["recompute_flops"])


def test_most_cases_are_proven():
    assert len(_proven()) >= len(CASES) - 2


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({_key(*c): digest(*c) for c in CASES},
                                 indent=1, sort_keys=True) + "\n")
