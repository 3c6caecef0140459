"""dralloc.stats.percentile: the one percentile every benchmark reports (nearest rank)."""

from __future__ import annotations

import pytest

from dralloc.stats import percentile


def test_percentile_is_nearest_rank() -> None:
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 101)), 50) == 50
    assert percentile(list(range(1, 101)), 100) == 100
    assert percentile([5.0], 50) == 5.0
    assert percentile([], 50) is None


def test_percentile_sorts_its_input_and_never_interpolates() -> None:
    values = [9.0, 1.0, 4.0, 2.0]
    assert percentile(values, 50) == 2.0  # ranks 1.0 2.0 | 4.0 9.0: the second value, not 3.0
    assert percentile(values, 75) == 4.0
    assert percentile(values, 99) == 9.0
    assert percentile(iter(values), 0) == 1.0  # any iterable; q 0 is the smallest
    assert values == [9.0, 1.0, 4.0, 2.0]  # the caller's list is left as it was


@pytest.mark.parametrize("n", [1, 2, 3, 10, 999, 1000])
def test_at_least_q_percent_are_at_or_below_it(n: int) -> None:
    values = [float(i) for i in range(n)]
    for q in (1, 50, 90, 99):
        p = percentile(values, q)
        assert p is not None
        at_or_below = sum(1 for v in values if v <= p)
        assert at_or_below / n >= q / 100  # enough values at or below
        assert (at_or_below - 1) / n < q / 100  # and it is the smallest such value
