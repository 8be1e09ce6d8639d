"""The memory model over a :class:`~autoremat_ilp.problem.Problem`, in exact integers.

The backward pass visits the regions in reverse; at region ``i``'s backward and forward
stages the bytes in use are::

    backward[i] = base[i] + sum(held[v] * save[v] for v released at regions <= i)
                          + sum(transient[v] * recompute[v] for v in region i)
    forward[i]  = forward_base[i] + sum(held[v] * save[v] for v in regions < i)
                                  + sum(forward_held[v] * save[v] for v in region i)

(the values saved so far stay until the backward of the region that releases them has
run, their own region's, or for a value handed on to later regions only, the first of
those: ``released``; the values region ``i`` recomputes are live together during its
backward). The plan's peak is the largest stage.

Nested regions (``nest``): regions sharing a ``nest`` id form a group run inside one more
checkpoint that keeps only the group's inputs, its forward run again when its backward
starts; their saved values are then held only at the backward stages of their group's
regions ``>=`` their own (the sums above skip them elsewhere): :func:`windows`.

Host offload (``can_offload``): an offloaded value is copied to host memory in its
region's forward pass and brought back for its region's backward pass, so it adds
``offload_forward[v]`` to ``forward[i]`` and ``offload_backward[v]`` to ``backward[i]``
and nothing to the stages in between, and takes ``held[v]`` bytes of host memory.

Reserved buffers (``unshared``): buffers that exist for the whole step (the compiler
allocates the step's outputs apart, whatever their live range) but can hold any value
that fits in one of them and is dead by the time it is written. Each stage then has
further bounds, ``reserved_base[i]`` (backward) or ``reserved_forward_base[i]`` (forward)
plus the same terms with the saved values restricted to a mask ``unshared[k]``, less the
reserved bytes ``reserved_room[k]`` (or ``reserved_room[k, i]`` at region ``i``'s
stages) those values may share: a stage's bytes are the largest of the bounds (values
of a size that only some reserved buffers fit in have the room of those alone). A
buffer holds one value at a time: with a cap ``reserved_cap[k] = t`` each value counts
at most ``t`` bytes and the room is at most ``t`` per buffer, a lower bound on the
stage whatever value each buffer holds; over the values' sizes ``t``, the largest of
these bounds is the stage's bytes when the buffers the values fit in are of one size.
A value larger than the bound's largest buffer (``reserved_fit[k]``) takes no room and
counts whole, capped or not.
"""

from __future__ import annotations

import numpy as np

from autoremat_ilp.problem import Problem

__all__ = ["evaluate", "host_bytes", "prune", "reserved_peaks", "stage_bytes", "violations",
           "windows"]


def _offload_mask(problem: Problem, offload: np.ndarray | None) -> np.ndarray:
    """``offload`` as booleans; none offloaded when it is ``None``."""
    if offload is None:
        return np.zeros(problem.num_values, dtype=bool)
    return offload.astype(bool)


def windows(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(backward, forward)``: ``[i, j]`` is whether region ``j``'s saved values are held
    at region ``i``'s backward (forward) stage."""
    R = problem.num_regions
    backward, forward = np.tri(R, dtype=bool), np.tri(R, k=-1, dtype=bool)
    if problem.nest is None:
        return backward, forward
    nested = problem.nest >= 0
    same = problem.nest[:, None] == problem.nest[None, :]
    return backward & (~nested[None, :] | same), forward & ~nested[None, :]


def stage_bytes(problem: Problem, save: np.ndarray, recompute: np.ndarray,
                offload: np.ndarray | None = None) -> np.ndarray:
    """Bytes in use at each stage of a plan, in exact integer arithmetic (module doc).

    Args:
      problem: the problem.
      save, recompute: boolean masks over the values.
      offload: boolean mask of the offloaded values; ``None``: none.

    Returns:
      ``2R`` Python integers (an object array): each region's backward stage, then each
      region's forward stage, in region order.
    """
    offloaded = _offload_mask(problem, offload)
    trans = _transients(problem, recompute, offloaded)
    saved = save.astype(bool)
    released, held, own = _held_by_region(problem, saved)
    own += _by_region(problem, offloaded, problem.offload_forward)
    stages = _stages(problem, problem.base, problem.forward_base, released, held, own, trans)
    for bound_stages in _reserved_stages(problem, saved, trans):
        stages = np.maximum(stages, bound_stages)
    return stages.astype(object)


def reserved_peaks(problem: Problem, save: np.ndarray, recompute: np.ndarray,
                   offload: np.ndarray | None = None) -> list[int]:
    """The largest stage of each further stage bound (:meth:`Problem.reserved_bounds`)
    for a plan (arguments as for :func:`stage_bytes`)."""
    trans = _transients(problem, recompute, _offload_mask(problem, offload))
    return [int(max(s, default=0)) for s in _reserved_stages(problem, save.astype(bool), trans)]


def _transients(problem: Problem, recompute: np.ndarray, offloaded: np.ndarray
                ) -> np.ndarray:
    """Per region, the bytes its backward recomputes and brings back from the host."""
    return (_by_region(problem, recompute.astype(bool), problem.transient)
            + _by_region(problem, offloaded, problem.offload_backward))


def _reserved_stages(problem: Problem, saved: np.ndarray, trans: np.ndarray
                     ) -> list[np.ndarray]:
    """Each further stage bound's backward then forward stages (``trans``: the bytes
    recomputed and brought back at each region's backward)."""
    out = []
    for bound in problem.reserved_bounds():
        # ``unshared`` comes with both reserved bases.
        assert problem.reserved_base is not None and problem.reserved_forward_base is not None
        released, held, own = _held_by_region(problem, saved, bound.held, bound.forward_held)
        out.append(_stages(problem, problem.reserved_base - bound.room,
                           problem.reserved_forward_base - bound.room, released, held, own,
                           trans))
    return out


def _by_region(problem: Problem, mask: np.ndarray, nbytes: np.ndarray | None,
               region: np.ndarray | None = None) -> np.ndarray:
    """Per region, the total of ``nbytes`` over the values in ``mask`` (zeros where
    ``nbytes`` is ``None``), each value counted at its ``region`` (by default, its own)."""
    region = problem.region if region is None else region
    total = np.zeros(problem.num_regions, dtype=np.int64)  # exact below 2**63 bytes
    if nbytes is not None:
        at = np.flatnonzero(mask)
        np.add.at(total, region[at], np.asarray(nbytes)[at].astype(np.int64))
    return total


def _held_by_region(problem: Problem, saved: np.ndarray, held: np.ndarray | None = None,
                    forward_held: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per region, the bytes the ``saved`` values hold to the end of its backward (by
    the region releasing them), those they hold from its forward on (by their own), and
    those they hold at its forward stage; each value counts its
    ``held`` and ``forward_held`` bytes (by default, the problem's)."""
    held = problem.held if held is None else held
    forward_held = problem.forward_held if forward_held is None else forward_held
    return (_by_region(problem, saved, held, problem.release_region),
            _by_region(problem, saved, held),
            _by_region(problem, saved, forward_held))


def _stages(problem: Problem, base: np.ndarray, forward_base: np.ndarray,
            released: np.ndarray, held: np.ndarray, own: np.ndarray, trans: np.ndarray
            ) -> np.ndarray:
    """Backward then forward stage bytes: a stage's base, what the regions whose saved
    values it holds hold (at a backward stage, by the region releasing them), and the
    region's own (forward) and recomputed (backward) values."""
    backward, forward = (w.astype(np.int64) for w in windows(problem))
    return np.concatenate([np.asarray(base, np.int64) + backward @ released + trans,
                           np.asarray(forward_base, np.int64) + forward @ held + own])


def evaluate(problem: Problem, save: np.ndarray, recompute: np.ndarray,
             offload: np.ndarray | None = None) -> tuple[float, int]:
    """The cost and peak of a plan.

    Args:
      problem: the problem.
      save, recompute: boolean masks over the values.
      offload: boolean mask of the offloaded values; ``None``: none.

    Returns:
      ``(cost, peak)``: the recompute cost plus the offload cost, and the largest of
      :func:`stage_bytes` (bytes).
    """
    peak = int(max(stage_bytes(problem, save, recompute, offload), default=0))
    cost = float(problem.cost[recompute.astype(bool)].sum())
    if offload is not None and offload.any():
        assert problem.offload_cost is not None  # an offloading problem has offload costs
        cost += float(problem.offload_cost[offload.astype(bool)].sum())
    return cost, peak


def host_bytes(problem: Problem, offload: np.ndarray | None) -> int:
    """Bytes the plan's offloaded values occupy in host memory.

    Args:
      problem: the problem.
      offload: boolean mask of the offloaded values; ``None``: none.

    Returns:
      The total ``held`` bytes of the offloaded values.
    """
    return int(sum(int(problem.held[v])
                   for v in np.flatnonzero(_offload_mask(problem, offload))))


def violations(problem: Problem, save: np.ndarray, recompute: np.ndarray,
               offload: np.ndarray | None = None) -> list[str]:
    """Every feasibility rule a plan breaks; the device budget is not checked, the host
    budget is.

    Args:
      problem: the problem.
      save, recompute: boolean masks over the values.
      offload: boolean mask of the offloaded values; ``None``: none.

    Returns:
      One message per broken rule, naming values by index (empty when the plan is valid).
    """
    s, r, o = save.astype(bool), recompute.astype(bool), _offload_mask(problem, offload)
    out = []
    for v in np.flatnonzero(problem.must_cover & ~s & ~r & ~o):
        out.append(f"value {v} is read by the backward pass but neither saved nor recomputed"
                   + (" nor offloaded" if o.any() else ""))
    can_offload = (problem.can_offload if problem.can_offload is not None
                   else np.zeros(problem.num_values, dtype=bool))
    for v in np.flatnonzero(o & ~can_offload):
        out.append(f"value {v} cannot be offloaded")
    for v in np.flatnonzero(o & s):
        out.append(f"value {v} is both saved and offloaded")
    if o.any() and host_bytes(problem, o) > problem.host_budget:
        out.append(f"offloaded values take {host_bytes(problem, o)} bytes of host memory, over "
                   f"the host budget of {problem.host_budget:.0f}")
    for v in np.flatnonzero(problem.must_save & ~s):
        out.append(f"value {v} is read by another region but not saved")
    for v in np.flatnonzero(s & ~problem.can_save):
        out.append(f"value {v} cannot be saved")
    for v in np.flatnonzero(r & ~problem.can_recompute):
        out.append(f"value {v} cannot be recomputed")
    for u, v in problem.edges:
        same = problem.region[u] == problem.region[v]
        if r[v] and not (s[u] or (same and (r[u] or o[u]))):
            out.append(f"value {v} is recomputed but its input {u} is not available")
    return out


def prune(problem: Problem, save: np.ndarray, recompute: np.ndarray,
          offload: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A plan without the saves, recomputes and offloads that nothing reads (a solver may
    leave them in). A saved value is neither recomputed nor offloaded.

    Args:
      problem: the problem.
      save, recompute: boolean masks over the values.
      offload: boolean mask of the offloaded values; ``None``: none.

    Returns:
      ``(save, recompute, offload)``, new boolean masks (``offload`` all ``False`` when
      it was ``None``).
    """
    s = save.astype(bool).copy()
    o = _offload_mask(problem, offload) & ~s
    r = recompute.astype(bool) & ~s & ~o
    adjacency = problem.adjacency
    kept = r.tolist()  # Python bools: indexing numpy scalars is slow
    # Readers come after their inputs (values are in program order): sweep backwards.
    for v in np.flatnonzero(r & ~problem.must_cover)[::-1].tolist():
        kept[v] = any(kept[w] for w in adjacency.local_readers[v])
    r = np.array(kept, dtype=bool)
    for v in np.flatnonzero(s & ~problem.must_cover & ~problem.must_save).tolist():
        s[v] = any(kept[w] for w in adjacency.readers[v])
    for v in np.flatnonzero(o & ~problem.must_cover).tolist():
        o[v] = any(kept[w] for w in adjacency.local_readers[v])
    return s, r, o
