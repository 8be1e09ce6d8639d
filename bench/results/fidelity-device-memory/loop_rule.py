"""Re-reads ``plans/`` under the loop rule of ``autoremat._measure`` (see
``../chip-hbm-room/``): a TPU step with a loop holds at most its compiler peak.

    PYTHONPATH=.:solvers python bench/results/fidelity-device-memory/loop_rule.py

For each row, plans its budget again (without ``verify``, ``layout="tiled"``; the function
as written for the row of that kind), lowers the plan and looks for a loop; a row with one
gets ``device = min(device, compiler_peak)`` (the figure before kept as
``device_without_loop_rule``). Rows are rewritten in place; prints one line per row.
"""

import json
import pathlib

import jax

from autoremat import _measure
from autoremat._planner._api import plan_with
from autoremat._planner._options import PlanOptions
from bench.fidelity import model_of

HERE = pathlib.Path(__file__).parent


def has_loop(fn, args) -> bool:
    argnums = _measure.float_argnums(args)
    return _measure._has_loop(jax.jit(jax.grad(fn, argnums)).lower(*args).as_text())


for path in sorted((HERE / "plans").glob("*.json")):
    rows = json.loads(path.read_text())
    model = model_of(rows[0]["model"])
    args, loss = (model.param_shapes(), model.batch_shapes()), model.make_loss()
    for r in rows:
        budget = "floor" if r["kind"] == "floor" else r["budget"]
        fn = loss if budget is None else plan_with(loss, args, {}, budget,
                                                   PlanOptions(layout="tiled")).apply(loss)
        before = r.pop("device_without_loop_rule", r["device"])
        r["loop"] = has_loop(fn, args)
        if r["loop"]:
            r["device_without_loop_rule"] = before
        r["device"] = min(before, r["compiler_peak"]) if r["loop"] else before
        print(path.stem, r["kind"], r["budget"], "loop" if r["loop"] else "no loop", flush=True)
    path.write_text(json.dumps(rows, indent=1))
