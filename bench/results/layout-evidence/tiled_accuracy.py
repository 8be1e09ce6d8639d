"""Plans at the floor and 1/3 and 2/3 of the way to the no-remat peak (both under LAYOUT),
without the closed loop, compiled for TPU v5e: predicted against compiler peak, one JSON
line each. Usage: PYTHONPATH=. python tiled_accuracy.py LAYOUT MODEL... (zoo or corpus)."""

import json
import sys

import autoremat
from autoremat import _measure, zoo
from bench import corpus

layout = sys.argv[1]
for name in sys.argv[2:]:
    m = corpus.CORPUS.get(name) or zoo.get(name)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    floor = autoremat.plan(loss, *args, budget="floor", layout=layout, time_limit_s=30)
    top = floor.no_remat_peak_bytes
    points = [("floor", floor)]
    for frac in (1 / 3, 2 / 3):
        budget = int(floor.peak_bytes + frac * (top - floor.peak_bytes))
        points.append((f"{frac:.2f}", autoremat.plan(loss, *args, budget=budget, layout=layout,
                                                      time_limit_s=30)))
    for point, p in points:
        real = autoremat.measure_step(p.apply(loss), *args, target="tpu-v5e",
                                      argnums=_measure.float_argnums(args)).peak_bytes
        print(json.dumps({"model": name, "layout": layout, "point": point,
                          "budget": p.budget_bytes, "pred": p.peak_bytes / 2**20,
                          "real": real / 2**20, "err": p.peak_bytes / real - 1,
                          "regions": len(p.placement.cuts) + 1}), flush=True)
