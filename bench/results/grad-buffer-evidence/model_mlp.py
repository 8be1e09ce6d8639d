"""The memory model's side for the zoo's mlp (no compile): the peak of no remat as the
model holds the function as written, and of the plan without verify at a budget, with each
further stage bound (gradient buffers shared) at the peak region. Usage: model_mlp.py BUDGET"""
import collections
import dataclasses
import sys

import autoremat_ilp as ilp
import numpy as np

import autoremat
from autoremat import _solve, zoo
from autoremat._planner import PlanOptions
from autoremat._planner._candidates import candidates
from autoremat._rewrite import flat_function

MiB = 2**20
m = zoo.get("mlp")
loss, args = m.make_loss(), (m.param_shapes(), m.batch_shapes())
options = PlanOptions(layout="tiled", verify=None)
p = autoremat.plan(loss, *args, budget=int(sys.argv[1]), layout="tiled", verify=None)
flat_fn, _, avals, _ = flat_function(loss, args, {})
graph, problem = next(c for c in candidates(flat_fn, avals, options) if c.placement == p.placement).problem(options)
ids = graph.array("id")
plans = {"no remat as written": _solve.as_written_masks(graph, problem),
         f"plan at {sys.argv[1]}": (np.isin(ids, list(p.saved)), np.isin(ids, list(p.recomputed)))}
print("arguments and gradients MiB", graph.fixed_bytes / MiB)
print("gradient buffers (MiB: count)", collections.Counter(round(b / MiB, 3) for b in graph.grad_buffers).most_common())
plain = dataclasses.replace(problem, unshared=None, reserved_room=None, reserved_cap=None,
                            reserved_base=None, reserved_forward_base=None)
for name, (save, recompute) in plans.items():
    save = save.astype(bool)
    stages = np.array(ilp.stage_bytes(problem, save, recompute), float)
    print(f"{name}: modelled peak {stages.max() / MiB:.1f} MiB; without the gradient-buffer bounds "
          f"{max(ilp.stage_bytes(plain, save, recompute)) / MiB:.1f}")
    print("  saved (bytes: count)", sorted(collections.Counter(int(h) for h in problem.held[save]).items(), reverse=True))
    trans = ilp.memory._transients(problem, recompute, np.zeros_like(save))
    for bound, bound_stages in zip(problem.reserved_bounds(), ilp.memory._reserved_stages(problem, save, trans), strict=True):
        counted = bound.held[save]
        # The same bound with the values larger than every buffer counted in full.
        whole = problem.held > max(graph.grad_buffers)
        full = np.where(whole & (bound.held > 0), problem.held, bound.held)
        full_fwd = np.where(whole & (bound.held > 0), problem.forward_held, bound.forward_held)
        released, held, own = ilp.memory._held_by_region(problem, save, full, full_fwd)
        in_full = ilp.memory._stages(problem, problem.reserved_base - bound.room,
                                     problem.reserved_forward_base - bound.room, released, held,
                                     own, trans)
        print(f"  bound: {int((counted > 0).sum())} saved values counted, each at most "
              f"{counted.max() / MiB:.1f} MiB, room up to {bound.room.max() / MiB:.0f} MiB: "
              f"largest stage {max(bound_stages) / MiB:.1f} MiB; "
              f"with values larger than every buffer in full {max(in_full) / MiB:.1f}")
