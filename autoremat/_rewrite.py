"""Rewriting: a function and a plan's saved values to the remat-optimized function.

The function is re-traced on every new trace of the wrapper, flattened exactly as the
tracer did (so value ids match), and re-run region by region through JAX: each region
in a ``jax.checkpoint`` (a scan's on its body, one region per iteration), each saved
value wrapped in ``checkpoint_name``, and the policy ``save_only_these_names``. Only
public transformations and names carry the decisions, so the result is the same with
``jax_remat3`` on or off.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

import jax
from jax._src import core as jax_core

from autoremat import _program, _sharding
from autoremat._errors import PlanMismatchError
from autoremat._placement import Placement


def flat_function(fn: Callable, args: tuple, kwargs: dict
                  ) -> tuple[Callable, list[Any], list[jax.ShapeDtypeStruct], dict]:
    """``fn`` as a function of its flat array leaves.

    Returns:
      The flat function, the leaves, their avals, and a dict whose ``"out_tree"`` is set
      to the output's tree structure once the flat function has run.
    """
    leaves, in_tree = jax.tree.flatten((args, kwargs))
    store: dict = {}

    def flat_fn(*flat: Any) -> list:
        a, k = jax.tree.unflatten(in_tree, flat)
        out, store["out_tree"] = jax.tree.flatten(fn(*a, **k))
        return out

    avals = [leaf_aval(x) for x in leaves]
    return flat_fn, leaves, avals, store


def leaf_aval(x: Any) -> jax.ShapeDtypeStruct:
    """The abstract value JAX traces the argument leaf ``x`` as, weak type included (a
    Python scalar is weakly typed, so that ``bf16_array * 0.5`` stays bfloat16), and its
    sharding over a mesh, if any (:func:`autoremat._sharding.leaf_sharding`). A leaf JAX
    cannot trace (a string, a function) raises JAX's own ``TypeError``."""
    aval = jax_core.shaped_abstractify(x)
    # An array's abstract value (pyright sees any AbstractValue).
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type,  # pyright: ignore[reportAttributeAccessIssue]
                                sharding=_sharding.leaf_sharding(x, aval))


def rewrite(fn: Callable, saved: Collection[int], fingerprint: str, placement: Placement,
            offloaded: Collection[int] = ()) -> Callable:
    """``fn`` with the plan applied (its saved values, its placement and the values it
    offloads to host memory): same signature, outputs and gradients."""
    named = frozenset(saved) | frozenset(offloaded)
    policy = _program.policy_for(saved, offloaded)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        flat_fn, leaves, avals, store = flat_function(fn, args, kwargs)
        _, program = _traced(flat_fn, avals, fingerprint)
        if placement.splits_scans:
            program = _program.split_scans(program, placement.scan_pieces, avals)
        regions = _program.split_regions(program, placement)
        outs = _program.run_program(program, regions, named, policy, leaves)
        return jax.tree.unflatten(store["out_tree"], outs)

    return wrapped


def as_written(fn: Callable, fingerprint: str) -> Callable:
    """``fn`` as written, for a plan that recomputes nothing: its own traced program, run
    once checked, as :func:`rewrite` checks, to be the program the plan was made for."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        flat_fn, leaves, avals, store = flat_function(fn, args, kwargs)
        closed, _ = _traced(flat_fn, avals, fingerprint)
        return jax.tree.unflatten(store["out_tree"], jax_core.jaxpr_as_fun(closed)(*leaves))

    return wrapped


def _traced(flat_fn: Callable, avals: list[jax.ShapeDtypeStruct], fingerprint: str
            ) -> tuple[jax_core.ClosedJaxpr, _program.Program]:
    """The jaxpr of ``flat_fn`` at ``avals``, and its program.

    Raises:
      PlanMismatchError: the program's fingerprint is not ``fingerprint``.
    """
    closed = jax.make_jaxpr(flat_fn)(*avals)
    program = _program.flatten(closed)
    if _program.fingerprint_of(program) != fingerprint:
        raise PlanMismatchError(
            f"this plan was made for another program (structure {fingerprint}, got "
            f"{_program.fingerprint_of(program)}): make a plan for this function and these "
            "argument shapes with autoremat.plan, or use autoremat.optimize, which plans per "
            "shape.")
    return closed, program
