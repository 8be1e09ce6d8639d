"""A plan's ``saved_bytes`` against the bytes JAX saves for its backward pass, on the full-size
corpus models, at the budgets of ``plans/`` (planned again without ``verify``, in ``LAYOUT``).

    PYTHONPATH=.:solvers python bench/results/fidelity-device-memory/saved_bytes_check.py LAYOUT MODEL...

Prints one line per plan: model, budget, planned bytes, JAX's bytes (its residuals not read
from an argument, each counted in ``LAYOUT`` as the plan counts its values), equal or not.
"""

import json
import pathlib
import sys

from autoremat._layout import array_bytes
from autoremat._planner._api import plan_with
from autoremat._planner._options import PlanOptions
from bench import corpus
from tests.models import saved_residuals

HERE = pathlib.Path(__file__).parent

layout = sys.argv[1]
for name in sys.argv[2:]:
    model = corpus.get(name)
    args, loss = (model.param_shapes(), model.batch_shapes()), model.make_loss()
    rows = json.loads((HERE / "plans" / f"{name}.json").read_text())
    budgets = ["floor", *dict.fromkeys(r["budget"] for r in rows if r["budget"] is not None)]
    for budget in budgets:
        p = plan_with(loss, args, {}, budget, PlanOptions(layout=layout))
        kept = sum(array_bytes(a.shape, a.dtype.itemsize, layout)
                   for a, src in saved_residuals(p.apply(loss), *args)
                   if not src.startswith("from the argument"))
        print(name, budget, p.saved_bytes, kept, "equal" if p.saved_bytes == kept else "DIFFER",
              flush=True)
