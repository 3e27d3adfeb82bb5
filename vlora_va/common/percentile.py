"""The one percentile of the project: nearest rank, the definition a reader can check by hand."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile of values in any order (0 < q <= 1): the smallest value with at least q of them at
    or below it. None when there are none (a figure that was not measured, not a 0)."""
    if not values:
        return None
    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]
