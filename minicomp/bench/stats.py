"""The numbers a bench cell reports: per-round ratios, their median and how far they spread.

Every backend runs once per round, the rounds interleaved (runner.py), so a ratio taken within
one round compares two calls made moments apart: a load spike slows both. The reported
speed-up is the median of those per-round ratios, never a ratio of medians or a mean, and its
spread (the interquartile range and the extremes) says how much to trust it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# A cell whose middle half of per-round ratios spans more than this fraction of their median
# is flagged as noisy in the table (`--max-spread` changes it). 0.25: a 2.00x cell is trusted
# when half its rounds lie within a 0.5x-wide band around it.
NOISY_SPREAD = 0.25


@dataclass(frozen=True)
class Spread:
    """The median of some values, their quartiles and extremes."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        """The spread of a non-empty list of values (quartiles inclusive of the extremes)."""
        if not values:
            raise ValueError("the spread of no values")
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return cls(statistics.median(values), q1, q3, min(values), max(values), len(values))

    @property
    def relative_iqr(self) -> float:
        """The interquartile range over the median: 0.1 means the middle half of the values
        lies within a band 10% of the median wide."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else math.inf

    def noisy(self, threshold: float = NOISY_SPREAD) -> bool:
        """Whether the values spread too widely to trust their median."""
        return self.relative_iqr > threshold


def round_ratios(base: list[float], this: list[float]) -> list[float]:
    """base[r] / this[r] for each round r both were timed in (above 1: `this` is faster)."""
    return [b / t for b, t in zip(base, this) if t > 0]


def significant(value: float, digits: int = 3) -> str:
    """`value` with `digits` significant figures and no exponent: 4.00, 12.3, 1081, 0.0430
    (a small speed-up keeps its digits instead of rounding to 0.0)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"
