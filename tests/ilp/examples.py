"""Small problems the tests of autoremat_ilp share."""

import dataclasses

import autoremat_ilp as ilp
import numpy as np
from autoremat_ilp.problem import NO_CAP


def two_regions(unshared):
    """Two regions of one value each, both read by the backward pass, with reserved
    buffers (the second stage bound) when ``unshared`` is a mask."""
    return ilp.Problem(
        cost=np.array([1.0, 1.0]), held=np.array([100, 10]), transient=np.array([50, 10]),
        region=np.array([0, 1]), base=np.array([50, 40]), forward_base=np.array([5, 5]),
        forward_held=np.array([0, 0]), must_cover=np.array([True, True]),
        must_save=np.array([False, False]), can_save=np.array([True, True]),
        can_recompute=np.array([True, True]), edges=np.zeros((0, 2), np.int64),
        reserved_base=np.array([70, 70]), reserved_forward_base=np.array([25, 25]),
        unshared=unshared)


def one_buffer_capped(held):
    """:func:`two_regions` with values of ``held`` bytes and one 20-byte reserved buffer,
    in two bounds: uncapped, and capped at 10 bytes (a buffer holds one value)."""
    return dataclasses.replace(two_regions(np.array([[True, True], [True, True]])),
                               held=held, transient=held, base=np.array([0, 0]),
                               reserved_base=np.array([20, 20]),
                               reserved_room=np.array([20, 10]),
                               reserved_cap=np.array([NO_CAP, 10]))


def keep_or_recompute():
    """Two regions, one value each, 10 bytes; value 0 costs 100 to recompute. Kept, value 0
    stays through region 1's stages."""
    return ilp.Problem(
        cost=np.array([100.0, 1.0]), held=np.array([10, 10]), transient=np.array([10, 10]),
        region=np.array([0, 1]), base=np.array([0, 0]), forward_base=np.array([5, 5]),
        forward_held=np.array([0, 0]), must_cover=np.array([True, True]),
        must_save=np.array([False, False]), can_save=np.array([True, True]),
        can_recompute=np.array([True, True]), edges=np.zeros((0, 2), np.int64))


def three_way():
    """:func:`keep_or_recompute` where value 0 may also be offloaded (cost 3): it then takes
    device memory only in region 0's forward and backward stages."""
    return dataclasses.replace(
        keep_or_recompute(), can_offload=np.array([True, False]),
        offload_cost=np.array([3.0, 0.0]), offload_forward=np.array([10, 0]),
        offload_backward=np.array([10, 0]), host_budget=10.0)


def chain():
    """Four values in two regions, a chain ``0 -> 1 -> 2 -> 3``; the backward reads 1
    and 3, region 1 reads value 1 (so it is saved), 0 and 2 only feed recomputes."""
    return ilp.Problem(
        cost=np.array([1.0, 2.0, 3.0, 4.0]), held=np.array([8, 4, 2, 1]),
        transient=np.array([8, 4, 2, 1]), region=np.array([0, 0, 1, 1]),
        base=np.array([10, 20]), forward_base=np.array([1, 2]),
        forward_held=np.array([0, 1, 0, 1]), must_cover=np.array([False, True, False, True]),
        must_save=np.array([False, True, False, False]), can_save=np.ones(4, bool),
        can_recompute=np.ones(4, bool), edges=np.array([[0, 1], [1, 2], [2, 3]]))


def released(problem):
    """``problem`` with its first value released at the last region's backward stage: it
    is handed on, and only the last region's backward reads it."""
    at = problem.region.copy()
    at[0] = problem.num_regions - 1
    return dataclasses.replace(problem, released=at)
