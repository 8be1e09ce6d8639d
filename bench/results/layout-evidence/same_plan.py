"""A tpu-layout plan's decisions evaluated under dense sizes; where its padded bytes are."""
import collections
import sys

import autoremat_ilp as ilp
import numpy as np

import autoremat
from autoremat import _rewrite, _solve, _trace, zoo

model, budget = sys.argv[1], int(sys.argv[2])
m = zoo.get(model)
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
p = autoremat.plan(loss, *args, budget=budget, time_limit_s=30, layout="tpu")
flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
_, _, gd = _trace.trace(flat_fn, avals, p.placement, "dense")
ids = gd.array("id")
save, rec = np.isin(ids, list(p.saved)), np.isin(ids, list(p.recomputed))
prob_d = _solve.problem_of(gd); prob_t = _solve.problem_of(p.graph)
print("tpu peak", p.peak_bytes / 2**20, "same plan dense peak", ilp.evaluate(prob_d, save, rec)[1] / 2**20)
print("saved dense", prob_d.held[save].sum() / 2**20, "saved tpu", prob_t.held[save].sum() / 2**20)
st = ilp.stage_bytes(prob_t, save, rec); sd = ilp.stage_bytes(prob_d, save, rec)
k = int(np.argmax(st)); print("peak stage", k, "of", len(st), "tpu", st[k] / 2**20, "dense", sd[k] / 2**20)
c = collections.Counter()
for v, vt, s in zip(gd.values, p.graph.values, save):
    if s: c[(v.primitive, v.shape, v.dtype)] += (vt.nbytes - v.nbytes) * v.multiplicity
for key, b in c.most_common(12): print(f"  {b / 2**20:8.1f} MiB padding saved  {key}")
