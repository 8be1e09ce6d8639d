"""Checkmate-style schedules and an independent simulator that replays them.

A schedule has ``T`` stages. In stage ``t`` the nodes with ``R[t, v]`` are computed in
ascending (topological) order; ``S[t, v]`` says value ``v`` is kept in memory from stage
``t - 1`` into stage ``t``. Frees are implied, free-after-last-use: a value not kept into
stage ``t + 1`` is freed right after its last use in stage ``t`` (at the start of the stage
if it has none, right after its computation if nothing in the stage reads it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autoremat_solvers.graph import ComputeGraph

__all__ = ["Schedule", "SimResult", "simulate"]

_MAX_VIOLATIONS = 20


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
    """A schedule over ``T`` stages of a graph of ``n`` nodes.

    Attributes:
      R: boolean ``(T, n)``: node ``v`` is computed in stage ``t``.
      S: boolean ``(T, n)``: node ``v``'s value is kept into stage ``t``.

    Example:
      >>> import numpy as np, autoremat_solvers as ars
      >>> graph = ars.chain_training_graph(1)  # f0, loss, f0_grad
      >>> schedule = ars.Schedule(R=np.eye(3, dtype=bool), S=np.tri(3, k=-1, dtype=bool))
      >>> ars.simulate(graph, schedule, budget=1000).ok
      True
    """

    R: np.ndarray
    S: np.ndarray

    def __post_init__(self) -> None:
        if self.R.shape != self.S.shape or self.R.ndim != 2:
            raise ValueError(f"R {self.R.shape} and S {self.S.shape} must be equal (T, n) shapes")
        object.__setattr__(self, "R", np.asarray(self.R, dtype=bool))
        object.__setattr__(self, "S", np.asarray(self.S, dtype=bool))


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What replaying a schedule found (:func:`simulate`).

    Attributes:
      cost: the total compute cost.
      peak_ram: the peak bytes resident.
      ok: no rule was broken.
      violations: every rule broken (up to 20), one line each.

    Example:
      >>> import autoremat_solvers as ars
      >>> graph = ars.chain_training_graph(4)
      >>> solve = ars.SOLVERS.get("checkmate_milp")
      >>> result = solve(graph, 1000, 10.0)
      >>> ars.simulate(graph, result.schedule, 1000).ok
      True
    """

    cost: float
    peak_ram: int
    ok: bool
    violations: tuple[str, ...]


def simulate(graph: ComputeGraph, schedule: Schedule, budget: float) -> SimResult:
    """Replays ``schedule`` on ``graph`` and checks it, trusting nothing a solver claimed.

    Checks: every input of a computed node is resident; every kept value was resident at
    the end of the previous stage (nothing is resident before stage 0); resident bytes
    plus the output being computed never exceed ``budget``; every graph output is computed.
    The cost is the sum of the costs of all computations in the schedule.

    Args:
      graph: the graph.
      schedule: the schedule; its ``n`` must match the graph.
      budget: memory budget in bytes.

    Returns:
      A :class:`SimResult`.

    Example:
      >>> import autoremat_solvers as ars
      >>> graph = ars.chain_training_graph(4)
      >>> solve = ars.SOLVERS.get("checkmate_milp")
      >>> result = solve(graph, 1000, 10.0)
      >>> ars.simulate(graph, result.schedule, 1000).cost == result.claimed_cost
      True
    """
    R, S = schedule.R, schedule.S
    if R.shape[1] != graph.n:
        return SimResult(
            float("nan"), 0, False, (f"schedule has {R.shape[1]} nodes, graph {graph.n}",)
        )
    T = R.shape[0]
    violations: list[str] = []
    resident: set[int] = set()  # values in memory at the end of the previous stage
    computed = np.zeros(graph.n, dtype=bool)
    cost = 0.0
    peak = 0
    for t in range(T):
        keep_next = set(np.flatnonzero(S[t + 1]).tolist()) if t + 1 < T else set()
        order = np.flatnonzero(R[t]).tolist()
        kept = set(np.flatnonzero(S[t]).tolist())
        violations += [
            f"stage {t}: keeps value {v}, which is not in memory" for v in sorted(kept - resident)
        ]
        live = kept & resident
        last_use = {v: -1 for v in live}
        for k in order:
            last_use[k] = max(last_use.get(k, -1), k)
            for p in graph.preds[k]:
                last_use[p] = max(last_use.get(p, -1), k)
        live -= {v for v in live if last_use[v] < 0 and v not in keep_next}
        mem = sum(graph.ram[v] for v in live)
        peak = max(peak, mem)
        for k in order:
            missing = [p for p in graph.preds[k] if p not in live]
            if missing:
                violations.append(f"stage {t}: computes {k} without its inputs {missing} in memory")
            during = mem + graph.ram[k]
            peak = max(peak, during)
            if during > budget:
                violations.append(
                    f"stage {t}: computing {k} needs {during} bytes > budget {budget:.0f}"
                )
            if k not in live:
                live.add(k)
                mem += graph.ram[k]
            cost += graph.cost[k]
            computed[k] = True
            for v in (*graph.preds[k], k):
                if v in live and last_use[v] <= k and v not in keep_next:
                    live.remove(v)
                    mem -= graph.ram[v]
        resident = live
    missing_outputs = [v for v in graph.outputs if not computed[v]]
    if missing_outputs:
        violations.append(f"outputs never computed: {missing_outputs}")
    return SimResult(cost, peak, not violations, tuple(violations[:_MAX_VIOLATIONS]))
