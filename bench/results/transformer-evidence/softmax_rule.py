"""Plans at the floor and 1/3 and 2/3 of the way to the no-remat peak, without the closed
loop, compiled for TPU v5e, with the memory model as it is (``off``) or with one more rule
(``on``): a recomputed value that XLA would fuse, that a reduction of its own chain feeds
(a softmax's probabilities, a layer norm's output) and that a dot reads, is counted as
materialized in its region's backward. One JSON line per plan.
Usage: PYTHONPATH=. python softmax_rule.py on|off MODEL... (zoo or corpus)."""

import dataclasses
import json
import sys

import numpy as np

from autoremat import _solve
from autoremat._cost import _REDUCTIONS
from bench.accuracy import floor_and_thirds

DOTS = {"dot_general", "conv_general_dilated"}
_problem_of = _solve.problem_of


def materialized_by_rule(graph) -> np.ndarray:
    """The values the rule counts: fused, downstream of a reduction, read by a dot."""
    index = {v.id: k for k, v in enumerate(graph.values)}
    values = graph.values
    after_reduction = np.zeros(len(values), bool)
    read_by_dot = np.zeros(len(values), bool)
    for k, v in enumerate(values):
        inputs = [index[u] for u in v.inputs if u in index]
        after_reduction[k] = v.fused and any(
            values[j].primitive in _REDUCTIONS or after_reduction[j] for j in inputs)
        if v.primitive in DOTS:
            read_by_dot[[j for j in inputs if values[j].region == v.region]] = True
    return after_reduction & read_by_dot


def with_rule(graph, op_times=None, offload=None):
    problem = _problem_of(graph, op_times, offload)
    extra = materialized_by_rule(graph)
    return dataclasses.replace(
        problem, transient=np.where(extra, graph.array("nbytes"), problem.transient))


rule = sys.argv[1]
if rule == "on":
    _solve.problem_of = with_rule
for name in sys.argv[2:]:
    for point, p, real in floor_and_thirds(name, time_limit_s=30):
        print(json.dumps({"model": name, "rule": rule, "point": point,
                          "budget": p.budget_bytes, "pred": round(p.peak_bytes / 2**20, 1),
                          "real": round(real / 2**20, 1),
                          "err": round(p.peak_bytes / real - 1, 4),
                          "overhead": round(p.overhead, 4)}), flush=True)
