"""Plans at the floor and 1/3 and 2/3 of the way to the no-remat peak (both under LAYOUT),
without the closed loop, compiled for TPU v5e: predicted against compiler peak, one JSON line
each. Usage: PYTHONPATH=. python tiled_accuracy.py LAYOUT MODEL... (zoo or corpus names)."""
import sys, json
import autoremat
from autoremat import zoo, _measure
from bench import corpus

layout = sys.argv[1]
for name in sys.argv[2:]:
    m = corpus.CORPUS.get(name) or zoo.get(name)
    loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
    fl = autoremat.plan(loss, *args, budget="floor", layout=layout, time_limit_s=30)
    top = fl.no_remat_peak_bytes
    pts = [("floor", fl)]
    for frac in (1/3, 2/3):
        b = int(fl.peak_bytes + frac * (top - fl.peak_bytes))
        pts.append((f"{frac:.2f}", autoremat.plan(loss, *args, budget=b, layout=layout, time_limit_s=30)))
    for tag, p in pts:
        r = autoremat.measure_step(p.apply(loss), *args, target="tpu-v5e", argnums=_measure.float_argnums(args))
        print(json.dumps(dict(model=name, layout=layout, point=tag, budget=p.budget_bytes if hasattr(p,'budget_bytes') else None,
              pred=p.peak_bytes/2**20, real=r.peak_bytes/2**20, err=p.peak_bytes/r.peak_bytes-1, regions=len(p.placement.cuts)+1)), flush=True)
