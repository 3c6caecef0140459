"""Summary numbers of measured samples (the benchmarks' latencies and waits): one percentile for all."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank `q`-th percentile of `values` (q in percent, 0 to 100): the smallest value
    with at least q% of the values at or below it, always one of the values (no interpolation);
    None when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]
