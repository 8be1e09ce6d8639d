"""The entry points: :func:`plan`, :func:`optimize` and :func:`load_plan`.

Planning is four stages over one :class:`PlanOptions`: the candidate placements
(:mod:`._candidates`), the search for the cheapest plan within the budget
(:mod:`._search`), the floor plans (:mod:`._floor`), and with ``verify`` the closed loop
on the compiler (:mod:`._closed_loop`); :mod:`._load` matches a policy file to a
function.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
from autoremat_ilp import Progress

from autoremat import _measure, _rewrite
from autoremat._budget import FLOOR, Budget, parse_budget
from autoremat._errors import InfeasibleBudgetError, SolverTimeoutError
from autoremat._layout import Layout
from autoremat._offload import OffloadConfig
from autoremat._op_times import OpTimes
from autoremat._plan import Plan
from autoremat._planner._candidates import (
    MODEL_ERROR,
    Candidate,
    SolverClock,
    as_written_plan,
    candidates,
    obvious_plans,
    per_layer_plan,
)
from autoremat._planner._closed_loop import ClosedLoop, decisions, verified_floor
from autoremat._planner._floor import floor_plans
from autoremat._planner._options import AUTO, NODE_LIMIT, PlanOptions
from autoremat._planner._search import Margins, search


def plan(fn: Callable, *args: Any, budget: Budget, time_limit_s: float = 60.0,
         node_limit: int | None = NODE_LIMIT, backends: tuple[str, ...] = ("HIGHS",),
         verify: str | None = AUTO, verify_rounds: int = 4, refine_rounds: int = 0,
         offload: OffloadConfig | None = None,
         progress: Progress | None = None, op_times: OpTimes | None = None,
         layout: Layout | Literal["auto"] = AUTO, nested_scans: bool = False,
         nested_segments: bool = False,
         **kwargs: Any) -> Plan:
    """Plans remat for ``fn(*args, **kwargs)`` under ``budget``.

    Args:
      fn: the function to differentiate (for example a loss). Its gradient with respect
        to any of its floating-point arguments follows the plan.
      *args, **kwargs: example arguments, arrays or ``jax.ShapeDtypeStruct`` leaves in
        any pytree; only shapes, dtypes and shardings are used. Leaves sharded over a
        mesh (a ``NamedSharding``) make the plan per device (see
        :mod:`autoremat._sharding`).
      budget: peak bytes of the whole gradient computation: an int, a string with a unit
        (``"6GiB"``, ``"512MiB"``, ``"2GB"``), a float in (0, 1], the fraction of the
        no-remat activation memory (on top of arguments and gradients), or ``"floor"``:
        the least peak the model allows, with the plan there that keeps the most room
        (the least-recompute plan at that budget spends every stage's slack on saving
        values the compiler may not fit beside the peak), or the function as written or
        one remat per layer where the model puts that least peak less than 10% of
        activation memory under theirs (within its error it cannot tell them apart, and
        they are the plans a user would write); with ``verify``, of the
        placements whose floor the model puts within 10% of the least (at most
        ``verify_rounds`` of them, lowest first), likewise of the nested placements
        (``nested_scans``, ``nested_segments``: considered here whatever they say), no
        remat and one remat per layer, the plan the compiler puts lowest (on a tie, the
        one that recomputes least), or the model's cheapest plan just under it where
        that compiles lower. For a sharded step, the bytes of one device (as are all of
        the plan's figures).
      time_limit_s: stop planning after about this long with the best plan found (its
        status is then ``"feasible"`` and ``gap`` bounds how far from optimal it may be).
        Tracing and building the problems count: the solver gets what they leave, though
        never less than a quarter of an equal share of the limit per placement. It can
        run over by the solver's own setup, and by that floor when tracing alone takes
        most of the limit. Since the time left depends on the machine and its load, a
        plan the time limit stopped may differ between runs with the same function,
        shapes and budget (a warning says so); a plan the solver proved (status
        ``"optimal"``), one ``node_limit`` stopped, or a saved plan (:meth:`Plan.save`,
        :func:`load_plan`) is reproducible. With ``verify``, each round (one plan, one
        compile) has its own limit.
      node_limit: the most branch-and-bound nodes of each solve (``None``: no limit). A
        search it stops ends at the same plan on any machine (status ``"feasible"``, its
        ``gap`` bounding how far from optimal).
      backends: MIP backends tried in turn within the time limit, from ``"HIGHS"``,
        ``"SCIP"`` and ``"CBC"`` (HiGHS through highspy, the others through OR-tools);
        HiGHS alone by default (see :class:`PlanOptions`).
      verify: a target of :mod:`autoremat._measure` (``"tpu-v5e"``, ``"tpu-v4"``, ...
        ahead of time; ``"tpu"``, ``"gpu"``: this process's device): the closed loop.
        The planned step is compiled for the target; while the compiler's peak exceeds
        the budget, the model's budget is lowered by the excess and the plan solved
        again, so that a returned plan fits on the real compiler
        (``Plan.verified_peak_bytes``). Each round is one compile (seconds to a minute).
        ``"auto"`` (default): this process's accelerator, compiled as the user's
        ``jax.jit`` compiles it (:func:`autoremat.local_target`), so that on a GPU or a
        TPU plans fit by default; on a CPU there is none, the model's plan stands, and its
        report says it was not compiled. ``None``: never compile.
      verify_rounds: the most compiles the closed loop makes before a plan fits.
      refine_rounds: with ``verify``, the most compiles spent, once a plan fits, on
        cheaper plans: each placement is solved again for the budget the compiler's
        errors on it allow (looser where its peak came out below the model's, halfway
        back where that was too loose; placements not compiled by the largest error
        seen), and the plan that fits with the least recompute is returned. It stops
        early when the solve gives no cheaper plan not compiled yet. A refined plan's
        ``peak_bytes`` (the model's) may exceed the budget; its ``verified_peak_bytes``
        does not. Default 0: the first plan that fits.
      offload: an :class:`autoremat.OffloadConfig` lets the plan offload residuals to host
        memory as a third choice besides saving and recomputing, under its host budget,
        priced by its transfer time (``Plan.offloaded``). ``None`` (default): no offload.
      progress: ``progress(elapsed_s, best, bound)``, called while the solver searches
        (with HiGHS through highspy; other backends only report their final result): the
        seconds since the solve started, the objective of the best plan found so far (the
        FLOPs it recomputes, plus small tie-breaks and the cost of its offloads, see
        :mod:`autoremat._solve`) and the solver's lower bound on it (``-inf`` before it has
        one). Each solve (one per candidate placement of regions, and per closed-loop
        round) reports on its own and ends with its final figures. It does not change the
        plan. Not called when the budget fits the plan that recomputes nothing.
      op_times: measured operation times (:func:`autoremat.measure_op_times`): the plan
        then minimizes recompute time, materializing operations costed by their measured
        time and fused elementwise ones by their FLOPs. ``None`` (default): FLOPs.
        ``Plan.recompute_flops`` counts FLOPs either way.
      layout: how a value's bytes are counted. ``"auto"`` (default): ``"tiled"`` where
        ``verify`` names a TPU, else ``"dense"``. ``"dense"``: its data, elements times
        item size. ``"tpu"``: its tiled TPU layout, the minor dimension padded to a
        multiple of 128 and the second-minor to a multiple of up to 8, every array at
        least 512 bytes (see :mod:`autoremat._layout`). It is a property of the target,
        not of the program: on TPU v5e 64-channel convolution activations take twice
        their data. Its effect on the model's error is measured in
        ``bench/results/accuracy-tpu.md`` (``bench/accuracy.py``). ``"tiled"``: the TPU
        tiles of the layout that pads it least, the padding no layout avoids: the model of
        a CNN's remat plans with few channels, measured against ``"dense"`` in
        ``bench/results/accuracy-layouts.md``.
      nested_scans: also consider each forward top-level scan nested: run as groups of
        about sqrt(length) iterations, each group in a checkpoint that keeps only its
        carry, the backward running a group's forward again (Chen et al. 2016,
        https://arxiv.org/abs/1604.06174; ``Placement.scan_groups``). It lowers the floor
        below one checkpoint per iteration at the cost of one more forward pass of the
        loop, so it is chosen only where every plan without it recomputes more (below
        the floor of one checkpoint per iteration, in practice). Off by default: on the
        compiler it lowers some models' floors and not others' while the model's
        prediction differs, so use it with ``verify``. ``budget="floor"`` with
        ``verify`` turns it and ``nested_segments`` on and compiles the nested floors
        beside the others (measured in ``bench/results/scan_structure.md`` and
        ``bench/results/nested.md``).
      nested_segments: also consider the finest placement's segments nested: consecutive
        segments in groups of about sqrt(their number), each group in one more
        checkpoint that keeps only its inputs, its forward run again when its backward
        starts (``Placement.segment_group``). Off by default, like ``nested_scans``
        (measured in ``bench/results/nested.md``).

    Returns:
      A :class:`Plan`.

    Raises:
      ValueError: the budget is malformed or not positive, or an option is out of range
        (:class:`PlanOptions`).
      InfeasibleBudgetError: no plan fits; the message states the smallest budget that does
        (with ``verify``, the lowest compiler peak among the plans compiled: the model's
        lowest plan, which is returned instead when it fits, and those of earlier rounds).
      SolverTimeoutError: the time limit passed before any plan was found.
      BudgetNotVerifiedError: with ``verify``, no plan fit on the compiler within
        ``verify_rounds`` compiles, nor the floor plans and the obvious plans compiled
        after them (an :class:`InfeasibleBudgetError` whose ``floor_bytes`` is the lowest
        compiler peak seen).
      CompilerUnavailableError: ``verify`` names a compiler this machine lacks.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> def loss(w, x):
      ...     for _ in range(4):
      ...         x = jnp.tanh(x @ w)
      ...     return jnp.sum(x ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> p = autoremat.plan(loss, w, x, budget="floor")
      >>> grads = jax.grad(p.apply(loss))(w, x)
    """
    options = PlanOptions(time_limit_s=time_limit_s, node_limit=node_limit,
                          backends=backends, verify=verify,
                          verify_rounds=verify_rounds, refine_rounds=refine_rounds,
                          offload=offload, progress=progress, op_times=op_times, layout=layout,
                          nested_scans=nested_scans, nested_segments=nested_segments)
    return plan_with(fn, args, kwargs, budget, options)


def plan_with(fn: Callable, args: tuple, kwargs: dict, budget: Budget, options: PlanOptions
              ) -> Plan:
    """:func:`plan` of ``fn(*args, **kwargs)`` with its options as one record."""
    if parse_budget(budget) == FLOOR and options.verify is not None:
        options = _with_nesting(options)
    traced_at = time.perf_counter()
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, kwargs)
    found = candidates(flat_fn, avals, options)
    solve = _solver(found, options, traced_at)
    if options.verify is None:
        return solve(budget, Margins())
    target = options.verify
    bound = functools.partial(fn, **kwargs)
    argnums = _measure.float_argnums(args)
    compiled_peak = lambda p: _measure.measure_step(p.apply(bound), *args, target=target,
                                                    argnums=argnums).peak_bytes
    if parse_budget(budget) == FLOOR:
        contenders = _floor_contenders(found, options)
        floor = verified_floor(contenders, compiled_peak, options.verify)
        return _under_the_verified_floor(floor, contenders, solve, compiled_peak)
    nesting = _with_nesting(options)
    nested = functools.cache(lambda: _nesting_candidates(found, flat_fn, avals, options))
    loop = ClosedLoop(solve, compiled_peak, options.verify, options.verify_rounds,
                      options.refine_rounds,
                      fallbacks=lambda: _floor_contenders(nested(), nesting),
                      solve_nesting=lambda b, m: _solver(nested(), nesting,
                                                         time.perf_counter())(b, m),
                      no_remat=lambda peak: as_written_plan(found, options, peak),
                      by_hand=lambda peak: [per_layer_plan(found, options, peak, around)
                                            for around in (False, True)])
    return loop.run(budget)


def _under_the_verified_floor(floor: Plan, contenders: Sequence[Plan],
                              solve: Callable[[Budget, Margins], Plan],
                              compiled_peak: Callable[[Plan], int]) -> Plan:
    """``floor``, or the cheapest plan the model has just under its compiled peak where
    that compiles lower (one compile, none where the model has no such plan, the solver
    finds none in its time or it is a contender): the model's error differs between
    plans, so it can compile lower than every floor contender (penzai's ``LayerStack``
    Llama on TPU v5e: 1.4 MiB lower, ``bench/results/on-chip-tpu-v5e/``)."""
    assert floor.verified_peak_bytes is not None  # verified_floor compiled it
    try:
        under = solve(floor.verified_peak_bytes - 1, Margins())
    except (InfeasibleBudgetError, SolverTimeoutError):
        return floor
    if decisions(under) in {decisions(c) for c in contenders}:
        return floor
    peak, compiles = compiled_peak(under), floor.verify_compiles + 1
    if peak >= floor.verified_peak_bytes:
        return dataclasses.replace(floor, verify_compiles=compiles)
    return dataclasses.replace(under, verified_peak_bytes=peak,
                               verify_target=floor.verify_target, verify_compiles=compiles)


def _with_nesting(options: PlanOptions) -> PlanOptions:
    """``options`` with nested placements: the model's error differs most between nested
    plans and the others, so a verified floor compiles the nested placements' floors too
    (:func:`_floor_contenders`), whatever the options."""
    return dataclasses.replace(options, nested_scans=True, nested_segments=True)


def _nesting_candidates(found: Sequence[Candidate], flat_fn: Callable, avals: Sequence,
                        options: PlanOptions) -> Sequence[Candidate]:
    """The candidates of ``options`` with nested placements (``found``, the candidates of
    ``options``, traced again only where they lack them): a budget below the model's floor
    falls back on their floor contenders, so that a budget at the verified floor fits
    (eqx-mlp's nests, 270 MiB on TPU v5e, where the placements without nesting compile at
    397 MiB and more), and a nested fallback that fits is refined among them."""
    nesting = _with_nesting(options)
    return found if nesting == options else candidates(flat_fn, avals, nesting)


def _floor_contenders(found: Sequence[Candidate], options: PlanOptions) -> list[Plan]:
    """The plans a verified floor is the lowest compiled of: the floor plans of the
    placements whose model floor is within ``MODEL_ERROR`` of the least (at most
    ``verify_rounds``, lowest first), likewise of the nested placements, weighed apart
    (the model's floor of a nested placement can be far below the others' and compile
    above them, or the other way round: ``bench/results/nested.md``), then no remat and
    one remat per layer."""
    clock = SolverClock.of(options, len(found))
    plain = [c for c in found if not c.placement.nests]
    nested = [c for c in found if c.placement.nests]
    floors = floor_plans(plain, options, clock, MODEL_ERROR)[:options.verify_rounds]
    if nested:
        floors += [p for p in floor_plans(nested, options, clock, MODEL_ERROR)
                   if p.placement.nests][:options.verify_rounds]
    contenders = [*floors, *obvious_plans(found, options, floors[0].no_remat_peak_bytes)]
    # A plan among both (one remat per layer, no remat) is compiled once.
    unique: dict[tuple, Plan] = {}
    for p in contenders:
        unique.setdefault((p.placement, p.saved, p.recomputed, p.no_remat), p)
    return list(unique.values())


def _solver(found: Sequence[Candidate], options: PlanOptions, traced_at: float
            ) -> Callable[[Budget, Margins], Plan]:
    """The plan for a budget under margins, over the placements ``found``; each call has
    its own time limit, the first counting from ``traced_at`` (tracing included)."""
    starts = iter([traced_at])

    def solve(budget: Budget, margins: Margins) -> Plan:
        clock = SolverClock.of(options, len(found), next(starts, time.perf_counter()))
        if parse_budget(budget) == FLOOR:
            return floor_plans(found, options, clock)[0]
        return search(found, budget, options, clock, margins)

    return solve


def optimize(fn: Callable, budget: Budget, *, static_argnums: int | Sequence[int] = (),
             **options: Any) -> Callable:
    """``fn`` with automatic remat under ``budget``: same signature, same gradients.

    The plan is made the first time the function is called (or traced) with a given
    structure, shapes and dtypes of arguments and values of the static arguments, and
    reused after.

    Do not wrap the result in another ``jax.checkpoint``: the outer policy would win.

    Args:
      fn: the function to differentiate (a loss), as for :func:`plan`.
      budget: as for :func:`plan`.
      static_argnums: positions of arguments that are not arrays (hashable, or compared by
        equality): a plan is made per value.
      **options: :func:`plan`'s keywords (``time_limit_s``, ``verify``, ``refine_rounds``,
        ``offload``, ``progress``, ``op_times``, ``layout``, ``nested_scans``, ...; see
        :class:`PlanOptions`).

    Returns:
      ``fn`` planned: same signature, outputs and gradients. Planning errors
      (:func:`plan`'s) are raised from its first call for a shape.

    Raises:
      ValueError: the budget is malformed, or an option is out of range.
      TypeError: an option is not one of :func:`plan`'s.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> def loss(w, x):
      ...     for _ in range(4):
      ...         x = jnp.tanh(x @ w)
      ...     return jnp.sum(x ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> grads = jax.jit(jax.grad(autoremat.optimize(loss, budget="floor")))(w, x)
    """
    parse_budget(budget)
    planning = PlanOptions(**options)
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    cache = _PlanCache()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        n = len(args)
        static_pos = tuple(sorted({i % n for i in static if -n <= i < n}))
        static_vals = tuple(args[i] for i in static_pos)
        dynamic = tuple(a for i, a in enumerate(args) if i not in static_pos)

        def bound(*dyn: Any, **kw: Any) -> Any:
            it = iter(dyn)
            full = [static_vals[static_pos.index(i)] if i in static_pos else next(it)
                    for i in range(n)]
            return fn(*full, **kw)

        leaves, tree = jax.tree.flatten((dynamic, kwargs))
        key = (tree, tuple(_rewrite.leaf_aval(x) for x in leaves),
               static_pos, static_vals)
        with lock:
            apply = cache.get(key)
            if apply is None:
                apply = plan_with(bound, dynamic, kwargs, budget, planning).apply(bound)
                cache.put(key, apply)
        return apply(*dynamic, **kwargs)

    return wrapped


class _PlanCache:
    """:func:`optimize`'s functions by call key. A key that cannot be hashed (a static
    argument holding a list, as Flax NNX graph definitions of modules with list attributes
    do) is looked up by equality, then identity."""

    def __init__(self) -> None:
        self._hashed: dict[Any, Callable] = {}
        self._unhashable: list[tuple[Any, Callable]] = []

    def get(self, key: Any) -> Callable | None:
        try:
            return self._hashed.get(key)
        except TypeError:
            return next((fn for k, fn in self._unhashable if _same(k, key)), None)

    def put(self, key: Any, fn: Callable) -> None:
        try:
            self._hashed[key] = fn
        except TypeError:
            self._unhashable.append((key, fn))


def _same(a: Any, b: Any) -> bool:
    """Whether two keys are equal (the same object, where ``==`` does not say)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a static value whose == is not a bool
        return a is b
