"""Plans at the floor and 1/3 and 2/3 of the way to the no-remat peak (both under LAYOUT),
without the closed loop, compiled for TPU v5e: predicted against compiler peak, one JSON
line each. Usage: PYTHONPATH=. python tiled_accuracy.py LAYOUT MODEL... (zoo or corpus)."""

import json
import sys

from bench.accuracy import floor_and_thirds

layout = sys.argv[1]
for name in sys.argv[2:]:
    for point, p, real in floor_and_thirds(name, layout=layout, time_limit_s=30):
        print(json.dumps({"model": name, "layout": layout, "point": point,
                          "budget": p.budget_bytes, "pred": p.peak_bytes / 2**20,
                          "real": real / 2**20, "err": p.peak_bytes / real - 1,
                          "regions": len(p.placement.cuts) + 1}), flush=True)
