"""The memory model: stage bytes, cost and peak, the feasibility rules, pruning."""

import dataclasses

import autoremat_ilp as ilp
import numpy as np
from autoremat_ilp.memory import reserved_peaks

from tests.ilp.examples import chain, one_buffer_capped, released, three_way, two_regions


def test_a_saved_value_that_fits_no_reserved_buffer_is_counted_beside_all_of_them():
    problem = two_regions(np.array([True, False]))
    save = np.array([True, True])
    # First region's backward: 70 (all gradients) + 100 (saved, fits in none) > 50 + 100.
    assert ilp.evaluate(problem, save, ~save)[1] == 170
    without = two_regions(None)
    assert ilp.evaluate(without, save, ~save)[1] == 150


def test_saved_values_pack_into_the_room_of_the_reserved_buffers_they_fit_in():
    # One bound counting both values, which may share 20 reserved bytes.
    problem = dataclasses.replace(two_regions(np.array([[True, True]])),
                                  reserved_room=np.array([20]))
    save = np.array([True, True])
    # Backward stages: 70 + 100 - 20 and 70 + 110 - 20 (the other bound: 150 and 150).
    assert ilp.stage_bytes(problem, save, ~save).tolist()[:2] == [150, 160]
    no_room = dataclasses.replace(problem, reserved_room=None)
    assert ilp.stage_bytes(no_room, save, ~save).tolist()[:2] == [170, 180]
    for budget in (160, 170):  # the program's rows are the same bounds
        solution = ilp.solve(problem, budget)
        assert solution.save is not None and solution.recompute is not None
        assert solution.peak == ilp.evaluate(problem, solution.save, solution.recompute)[1]
        assert solution.peak <= budget


def test_a_value_larger_than_every_reserved_buffer_counts_whole_in_a_capped_bound():
    """A 30-byte value fits in no 20-byte reserved buffer: capped at 10 bytes, the bound
    counts it whole and the 10-byte value beside it at most 10 (the zoo's MLP: its 16 MiB
    hidden activations fit in none of its 8 MiB weight gradients)."""
    cap = one_buffer_capped(np.array([30, 10]))
    save = np.array([True, True])
    # Second region's backward: 20 + 30 + 10 - 20 uncapped, 20 + 10 + 10 - 10 capped.
    assert reserved_peaks(cap, save, ~save) == [40, 30]
    fit = dataclasses.replace(cap, reserved_fit=np.array([20, 20]))
    # Capped, the 30-byte value counts whole: 20 + 30 + 10 - 10.
    assert reserved_peaks(fit, save, ~save) == [40, 50]
    assert ilp.evaluate(fit, save, ~save)[1] == 50
    assert fit.with_bounds(np.array([False, True])).reserved_fit.tolist() == [20]
    solution = ilp.solve(fit, 45)
    assert solution.save is not None and solution.recompute is not None
    assert solution.peak == ilp.evaluate(fit, solution.save, solution.recompute)[1] <= 45


def test_a_reserved_buffer_holds_one_saved_value_at_a_time():
    # Two 10-byte values, one 20-byte reserved buffer: room for both only if two values
    # could share it; capped at 10 bytes, the buffer holds 10 of them.
    cap = one_buffer_capped(np.array([10, 10]))
    save = np.array([True, True])
    assert ilp.stage_bytes(cap, save, ~save).tolist()[:2] == [20, 30]
    uncapped = dataclasses.replace(cap, unshared=cap.unshared[:1], reserved_room=np.array([20]),
                                   reserved_cap=None)
    assert ilp.stage_bytes(uncapped, save, ~save).tolist()[:2] == [10, 20]
    # The capped bound is lazy (left out of the MILP until a plan breaks it): saving both
    # fits the uncapped bounds at 20 bytes.
    assert cap.lazy_bounds().tolist() == [False, True]
    solution = ilp.solve(cap, 25)
    assert solution.save is not None and solution.recompute is not None
    assert solution.save.sum() == 1
    assert solution.peak == ilp.evaluate(cap, solution.save, solution.recompute)[1] <= 25
    lowest = ilp.solve_min_peak(cap)
    assert lowest.save is not None and lowest.recompute is not None
    assert lowest.peak == ilp.evaluate(cap, lowest.save, lowest.recompute)[1] == 20


def test_stages_are_backward_then_forward_and_count_saved_values_until_their_backward():
    problem = chain()
    save = np.array([False, True, False, True])
    recompute = np.array([False, False, False, False])
    # Backward: region 0 holds 4 (value 1), region 1 holds 4 + 1; forward: region 0 its
    # own saved value's 1 forward byte, region 1 region 0's 4 and its own 1.
    assert ilp.stage_bytes(problem, save, recompute).tolist() == [14, 25, 2, 7]
    assert ilp.evaluate(problem, save, recompute) == (0.0, 25)
    recompute = np.array([True, False, True, True])
    save = np.array([False, True, False, False])
    # Region 1 recomputes 2 and 3 (3 bytes), region 0 recomputes 0 (8).
    assert ilp.stage_bytes(problem, save, recompute).tolist() == [22, 27, 2, 6]
    assert ilp.evaluate(problem, save, recompute) == (8.0, 27)


def test_a_value_handed_on_is_freed_after_the_backward_of_the_region_releasing_it():
    problem = dataclasses.replace(chain(), released=np.array([0, 1, 1, 1]))
    save = np.array([False, True, False, True])
    # Value 1 (4 bytes) is read by region 1 alone: gone from region 0's backward stage
    # (14 before), held at every forward stage after its own as before.
    assert ilp.stage_bytes(problem, save, np.zeros(4, bool)).tolist() == [10, 25, 2, 7]
    solution = ilp.solve_min_peak(problem)
    assert solution.save is not None and solution.recompute is not None
    assert solution.peak == ilp.evaluate(problem, solution.save, solution.recompute)[1]
    assert released(chain()).released.tolist() == [1, 0, 1, 1]


def test_a_nested_group_holds_its_saved_values_only_in_its_own_backward():
    problem = dataclasses.replace(chain(), nest=np.array([0, 0]))
    backward, forward = ilp.memory.windows(problem)
    assert backward.tolist() == [[True, False], [True, True]]
    assert not forward.any()  # made again when the group's backward starts
    save = np.array([False, True, False, True])
    assert ilp.stage_bytes(problem, save, np.zeros(4, bool)).tolist() == [14, 25, 2, 3]


def test_violations_name_every_broken_rule():
    problem = chain()
    save, recompute = np.zeros(4, bool), np.array([False, False, False, True])
    assert ilp.violations(problem, save, recompute) == [
        "value 1 is read by the backward pass but neither saved nor recomputed",
        "value 1 is read by another region but not saved",
        "value 3 is recomputed but its input 2 is not available"]
    # Region 1 cannot recompute region 0's value 1: it must be saved.
    recompute = np.array([True, True, True, True])
    assert ilp.violations(problem, save, recompute) == [
        "value 1 is read by another region but not saved",
        "value 2 is recomputed but its input 1 is not available"]
    assert ilp.violations(problem, np.array([False, True, False, False]),
                          np.array([False, False, True, True])) == []


def test_offload_rules_and_host_bytes():
    problem = three_way()
    save, recompute = np.array([False, True]), np.zeros(2, bool)
    offload = np.array([True, False])
    assert ilp.violations(problem, save, recompute, offload) == []
    assert ilp.host_bytes(problem, offload) == 10 and ilp.host_bytes(problem, None) == 0
    # Offload cost joins the cost; region 0's stages carry the transfers.
    assert ilp.evaluate(problem, save, recompute, offload) == (3.0, 15)


def test_prune_drops_what_nothing_reads():
    problem = chain()
    # Value 0 is saved and value 2 recomputed, but nothing that is recomputed reads them.
    save, recompute, offload = ilp.prune(problem, np.array([True, True, False, True]),
                                         np.array([False, False, True, False]))
    assert save.tolist() == [False, True, False, True]
    assert not recompute.any() and not offload.any()
    # Recomputing 3 needs 2 recomputed, which needs 1 saved: all kept.
    save, recompute, _ = ilp.prune(problem, np.array([True, True, False, False]),
                                   np.array([False, False, True, True]))
    assert save.tolist() == [False, True, False, False]
    assert recompute.tolist() == [False, False, True, True]
    # A saved value is neither offloaded nor recomputed as well.
    problem = three_way()
    save, recompute, offload = ilp.prune(problem, np.array([True, True]), np.array([True, True]),
                                         np.array([True, False]))
    assert save.all() and not recompute.any() and not offload.any()
