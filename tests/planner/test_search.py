"""The search over placements (``autoremat._planner._search``)."""

import math

from autoremat._planner._search import OPTIMALITY_GAP, _rivals


def test_a_later_placement_is_a_rival_only_below_what_the_search_before_it_returns():
    start, cheapest = 100.0, math.inf
    # What the search returns costs at most its start's cost: a placement whose bound is
    # not below that by more than the gap will be cut off, and gets no share of the time.
    near = start * (1 - OPTIMALITY_GAP)
    assert _rivals([50.0, near, near * (1 + 1e-9), 200.0], cheapest, start) == 2
    # A plan found before, cheaper than the start, rules out more.
    assert _rivals([50.0, 80.0, 99.0], 60.0, start) == 1
    assert _rivals([50.0, 80.0], cheapest, math.inf) == 2  # no start: every one may win
