from __future__ import annotations

import numpy as np
import pytest

from autoremat import parse_budget


@pytest.mark.parametrize("budget, expected", [
    (1000, 1000), (np.int64(7), 7), ("6GiB", 6 * 2**30), ("512MiB", 512 * 2**20),
    ("2GB", 2 * 10**9), ("1.5 GiB", 3 * 2**29), (0.4, 0.4), (1.0, 1.0), ("floor", "floor"),
    (" Floor ", "floor"),
])
def test_accepted_forms(budget, expected):
    assert parse_budget(budget) == expected


@pytest.mark.parametrize("budget", [0, -5, 0.0, 1.5, -0.1, "6G", "lots", "", "-1GiB", True,
                                    None, [1]])
def test_rejected_forms_name_the_accepted_ones(budget):
    with pytest.raises(ValueError, match="GiB") as info:
        parse_budget(budget)
    assert "fraction" in str(info.value) and "'floor'" in str(info.value)
