"""Loading a policy file: its decisions found on a re-trace of the function, checked and
costed afresh."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import autoremat_ilp as ilp
import numpy as np

from autoremat import _rewrite, _solve, _trace
from autoremat._graph import Graph
from autoremat._plan import Plan
from autoremat._planner._candidates import (
    candidates,
    no_remat_peak,
    no_remat_plan,
    plan_of,
    with_saved_bytes_of_jax,
)
from autoremat._planner._options import PlanOptions
from autoremat._policy_file import PolicyFile
from autoremat._sites import Site


def load_plan(path: str | os.PathLike, fn: Any, *args: Any, **kwargs: Any) -> Plan:
    """The plan saved at ``path`` (by :meth:`Plan.save`), for ``fn(*args, **kwargs)``.

    ``fn`` is traced again and each of the file's decisions found among its values; the
    plan saves and recomputes the same values as the saved plan, and its figures are
    predicted afresh, under the file's layout.

    Args:
      path: the policy file.
      fn: the function the plan was made for.
      *args, **kwargs: example arguments as for :func:`autoremat.plan` (only shapes and
        dtypes).

    Returns:
      The :class:`autoremat.Plan`.

    Raises:
      OSError: the file cannot be read.
      autoremat.PolicyFileError: the file is not a valid policy file; the message names
        the field.
      autoremat.PolicyMismatchError: the file does not match ``fn`` and these argument
        shapes (a decision's values are not all found, the decisions are not a valid plan,
        or their predicted peak exceeds the budget); the message lists the differences.

    Example:
      >>> import os, tempfile, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> plan = autoremat.plan(loss, w, x, budget="floor")
      >>> path = os.path.join(tempfile.mkdtemp(), "plan.json")
      >>> plan.save(path)
      >>> autoremat.load_plan(path, loss, w, x).saved == plan.saved
      True
    """
    policy = PolicyFile.read(path)
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, kwargs)
    _, _, graph = _trace.trace(flat_fn, avals, policy.placement, policy.layout)
    chosen, differences = policy.locate(graph)
    problem = _solve.problem_of(graph, offload=policy.offload)
    d = None
    if not differences:
        d, differences = _evaluate(policy, graph, problem, chosen)
        differences = differences or policy.structure_differences(graph)
    if differences:
        raise policy.mismatch(os.fspath(path), differences)
    assert d is not None  # located and evaluated without differences
    options = PlanOptions(offload=policy.offload, layout=policy.layout)
    found = candidates(flat_fn, avals, options)
    no_remat = no_remat_peak(found, options)
    baseline = _solve.no_remat(graph, problem)
    if (d.saved, d.recomputed, d.offloaded) == (baseline.saved, baseline.recomputed,
                                                frozenset()):
        plan = no_remat_plan(found[0].facts, graph, d, policy.budget_bytes, no_remat, options)
    else:
        plan = with_saved_bytes_of_jax(plan_of(graph, d, policy.budget_bytes, no_remat,
                                               options), found[0].facts)
    return dataclasses.replace(plan, verified_peak_bytes=policy.verified_peak_bytes,
                               verify_target=policy.target)


def _evaluate(policy: PolicyFile, graph: Graph, problem: ilp.Problem,
              chosen: Mapping[int, str]) -> tuple[_solve.Decisions, list[str]]:
    """The figures of the actions ``chosen`` on ``graph`` (whose problem is ``problem``),
    and each rule of a valid plan they break, and a peak over the file's budget. Status,
    gap and solve time are the file's."""
    ids = graph.array("id").tolist()
    save, recompute, offload = (np.array([chosen.get(i) == action for i in ids], dtype=bool)
                                for action in ("save", "recompute", "offload"))
    # The rules name values by index in graph.values: add where each is made.
    sites = [str(Site.of(v)) for v in graph.values]
    name = lambda m: f"{m.group(1)} {m.group(2)} ({sites[int(m.group(2))]})"
    differences = [re.sub(r"(value|input) (\d+)", name, msg)
                   for msg in ilp.violations(problem, save, recompute, offload)]
    cost, peak = _solve.evaluate(graph, problem, save, recompute, offload)
    if policy.no_remat:  # the function as written, whose compiler fuses what JAX saves
        peak = _solve.as_written(graph, problem).peak_bytes
    decisions = _solve.decisions(graph, problem, ilp.Solution(
        ilp.Status(policy.status), save, recompute, cost, peak, cost, policy.gap,
        policy.solve_seconds, offload if policy.offload is not None else None))
    # The function as written near no remat, and a plan the compiler fitted (verify), may
    # be modelled over the budget: hold them to the file's own prediction.
    over_budget = policy.no_remat or policy.verified_peak_bytes is not None
    limit, what = ((policy.peak_bytes, "predicted peak")
                   if over_budget and policy.peak_bytes > policy.budget_bytes
                   else (policy.budget_bytes, "budget"))
    if decisions.peak_bytes > limit:
        differences.append(
            f"predicted peak: {decisions.peak_bytes} bytes for the function, over the "
            f"file's {what} of {limit} bytes")
    return decisions, differences
