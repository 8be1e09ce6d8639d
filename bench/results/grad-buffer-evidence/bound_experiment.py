"""Session 43 experiment, run at 76bc91b (before Problem.reserved_fit): each plan of the
library as it was, its capped bounds evaluated as they were ("old") and with a value
larger than every gradient buffer of a bound counted whole ("new"), beside its device
memory on TPU v5e (ahead of time). Usage: bound_experiment.py MODEL BUDGET_MIB|floor...
(PYTHONPATH=.:solvers, AUTOREMAT_MEASURE_CACHE for the compiles). At ff8a8a7 and after,
the "old" column includes the rule already. It runs on the library of 76bc91b, which has
no Problem.reserved_fit, so largest_per_bound repeats Graph.reserved_room's loop there;
on ff8a8a7 and after, a bound's largest buffer is reserved_room's fourth result."""
import sys

import autoremat_ilp as ilp
import numpy as np
from autoremat_ilp import problem as P
from autoremat_ilp.problem import NO_CAP

import autoremat
from autoremat import _measure, _solve, zoo

M = 2**20
name = sys.argv[1]; budgets = sys.argv[2:]
m = zoo.get(name)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())

def largest_per_bound(graph, held):
    sizes = sorted(set(graph.grad_buffers), reverse=True)
    buffers = np.array(graph.grad_buffers); out = []; masks = []
    for s in sizes:
        mask = held > s
        if masks and (mask == masks[-1]).all():
            continue
        fits = buffers > s
        largest = buffers[fits].max(initial=0)
        for _t in (NO_CAP, *sorted(set(held[mask & (held < largest)].tolist()))):
            masks.append(mask); out.append(largest)
    return out

orig = P.Problem.reserved_bounds
def new_bounds(self):
    bs = orig(self)
    L = getattr(self, "_largest", None)
    if L is None: return bs
    out = []
    for b, lg, m in zip(bs, L, np.atleast_2d(self.unshared)):
        whole = m & (self.held > lg)
        out.append(P.ReservedBound(np.where(whole, self.held, b.held), np.where(whole, self.forward_held, b.forward_held), b.room))
    return out

for b in budgets:
    budget = b if b == "floor" else int(float(b) * M)
    p = autoremat.plan(loss, *args, budget=budget, layout="tiled")
    g = p.graph; prob = _solve.problem_of(g)
    ids = [v.id for v in g.values]
    save = np.array([i in p.saved for i in ids]); rec = np.array([i in p.recomputed for i in ids])
    old = max(ilp.memory.stage_bytes(prob, save, rec))
    object.__setattr__(prob, "_largest", largest_per_bound(g, g.array("held_bytes"))) if prob.unshared is not None else None
    P.Problem.reserved_bounds = new_bounds
    new = max(ilp.memory.stage_bytes(prob, save, rec))
    P.Problem.reserved_bounds = orig
    meas = _measure.measure_step(p.apply(loss), *args, target="tpu-v5e")
    print(f"{name} {b}: plan {p.peak_bytes/M:.1f} old-bound {old/M:.1f} new-bound {new/M:.1f} device {meas.peak_bytes/M:.1f} cpk {meas.compiler_peak_bytes/M:.1f} overhead {p.modeled_overhead:.3f}", flush=True)
