"""Sets of time intervals ``(start, end)``: union, difference, and how much of a span they cover.

Example:
    >>> merged = merge([(5, 7), (0, 2), (1, 3)])
    >>> merged, subtract(merged, [(1, 6)]), covered(merged, 0, 10)
    ([(0, 3), (5, 7)], [(0, 1), (6, 7)], 5.0)
"""

from __future__ import annotations

import bisect
import heapq
from array import array
from collections.abc import Iterable, Iterator
from operator import sub

Interval = tuple[float, float]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of ``(start, end)`` intervals (empty ones dropped).

    Example:
        >>> merge([(5, 7), (0, 2), (1, 3)])
        [(0, 3), (5, 7)]
    """
    # [lo, hi] is the union since the last gap, ``given`` the interval it is while it is one:
    # its tuple is kept, not a copy (millions of operators make millions of these)
    out: list[Interval] = []
    given: Interval | None
    ordered = iter(sorted(intervals))
    for given in ordered:  # the first that does not end before it starts
        lo, hi = given
        if not hi < lo:
            break
    else:
        return out
    for interval in ordered:
        start, end = interval
        if end < start:
            continue
        if start <= hi:
            if end > hi:
                hi, given = end, None
        else:
            out.append(given if type(given) is tuple else (lo, hi))
            lo, hi, given = start, end, interval
    out.append(given if type(given) is tuple else (lo, hi))
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of merged intervals ``a`` not covered by merged intervals ``b``."""
    if not b:
        return [interval for interval in a if interval[0] < interval[1]]
    return list(subtract_iter(a, b))


def subtract_iter(a: Iterable[Interval], b: list[Interval]) -> Iterator[Interval]:
    """:func:`subtract` one interval at a time (``b`` not empty)."""
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        cur = start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                yield (cur, b[k][0])
            cur = max(cur, b[k][1])
            k += 1
        if cur < end:
            yield (cur, end)


def covered(merged: list[Interval], start: float, end: float) -> float:
    """Length of ``[start, end]`` covered by sorted, disjoint ``merged`` intervals."""
    total = 0.0
    i = max(bisect.bisect_right(merged, (start, float("inf"))) - 1, 0)
    while i < len(merged) and merged[i][0] < end:
        s, e = merged[i]
        total += max(0.0, min(e, end) - max(s, start))
        i += 1
    return total


class Spans:
    """Sorted, disjoint intervals as two ``array('d')`` columns (16 bytes an interval, against
    ~110 for a tuple of two floats in a list): the union of millions of operators.

    Example:
        >>> spans = Spans.union([[(0.0, 2.0), (1.0, 3.0), (5.0, 7.0)]])
        >>> list(spans), spans.covered(0.0, 10.0)
        ([(0.0, 3.0), (5.0, 7.0)], 5.0)
    """

    def __init__(self) -> None:
        self.starts = array("d")
        self.ends = array("d")

    @classmethod
    def union(cls, runs: Iterable[Iterable[Interval]]) -> Spans:
        """The union of ``runs``, each in start order (as :func:`merge` gives it)."""
        out = cls()
        for start, end in heapq.merge(*runs):
            out.add(start, end)
        return out

    def add(self, start: float, end: float) -> None:
        """Adds ``(start, end)``, which starts at or after every interval added before."""
        if end < start:
            return
        ends = self.ends
        if ends and start <= ends[-1]:
            if end > ends[-1]:
                ends[-1] = end
        else:
            self.starts.append(start)
            ends.append(end)

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Iterator[Interval]:
        return zip(self.starts, self.ends, strict=True)

    def minus(self, b: list[Interval]) -> Spans:
        """The parts not covered by merged intervals ``b`` (as :func:`subtract`)."""
        out = Spans()
        if not b:
            for start, end in self:
                if start < end:
                    out.starts.append(start)
                    out.ends.append(end)
            return out
        for start, end in subtract_iter(self, b):
            out.starts.append(start)
            out.ends.append(end)
        return out

    def covered(self, start: float, end: float) -> float:
        """Length of ``[start, end]`` these intervals cover (as :func:`covered`, the same sum in
        the same order: the intervals wholly inside are added without a Python loop)."""
        starts, ends = self.starts, self.ends
        i = max(bisect.bisect_right(starts, start) - 1, 0)
        j = bisect.bisect_left(starts, end, i)  # intervals i .. j-1 start before ``end``
        if j <= i:
            return 0.0
        total = max(0.0, min(ends[i], end) - max(starts[i], start))
        if j - i == 1:
            return total
        # between the first and the last, each interval lies wholly inside: starts[k] > start
        # (k > i) and ends[k] <= starts[k + 1] < end (k < j - 1)
        total = sum(map(sub, ends[i + 1:j - 1], starts[i + 1:j - 1]), total)
        return total + max(0.0, min(ends[j - 1], end) - max(starts[j - 1], start))
