"""Sets of time intervals ``(start, end)``: union, difference, and how much of a span they cover.

Example:
    >>> merged = merge([(5, 7), (0, 2), (1, 3)])
    >>> merged, subtract(merged, [(1, 6)]), covered(merged, 0, 10)
    ([(0, 3), (5, 7)], [(0, 1), (6, 7)], 5.0)
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of ``(start, end)`` intervals (empty ones dropped).

    Example:
        >>> merge([(5, 7), (0, 2), (1, 3)])
        [(0, 3), (5, 7)]
    """
    out: list[Interval] = []
    for interval in sorted(intervals):
        start, end = interval
        if end < start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:  # the caller's tuple kept, not a copy: millions of operators make millions of these
            out.append(interval if type(interval) is tuple else (start, end))
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of merged intervals ``a`` not covered by merged intervals ``b``."""
    if not b:
        return [interval for interval in a if interval[0] < interval[1]]
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        cur = start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def covered(merged: list[Interval], start: float, end: float) -> float:
    """Length of ``[start, end]`` covered by sorted, disjoint ``merged`` intervals."""
    total = 0.0
    i = max(bisect.bisect_right(merged, (start, float("inf"))) - 1, 0)
    while i < len(merged) and merged[i][0] < end:
        s, e = merged[i]
        total += max(0.0, min(e, end) - max(s, start))
        i += 1
    return total
