"""``Spans.covered`` (columns, the summary's hot path) agrees with ``covered`` (lists) on any query;
``merge`` gives the union a point-by-point reading gives."""

from __future__ import annotations

import math
import random

import pytest

from profcallbacks.report.model.intervals import Spans, covered, merge


@pytest.mark.parametrize("origin", [0.0, 1e6, 1.7e12])  # traces' timestamps: relative to absolute
def test_spans_cover_what_the_merged_list_covers(origin):
    rng = random.Random(7)
    for _ in range(500):
        t, intervals = origin, []
        for _ in range(rng.randint(0, 40)):
            t += rng.choice([0.0, 0.5, 1.0, 3.25, 10.0])
            intervals.append((t, t + rng.choice([0.0, 0.25, 1.0, 7.5, 30.0])))
        merged = merge(intervals)
        spans = Spans.union([merged])
        lo, hi = origin - 5, t + 40
        for _ in range(20):
            start = rng.choice([rng.uniform(lo, hi)] + [s for s, _ in intervals[:3]])
            end = start + rng.choice([0.0, 0.5, 3.0, 20.0, 100.0, 1e4])
            assert math.isclose(spans.covered(start, end), covered(merged, start, end),
                                rel_tol=1e-12, abs_tol=1e-9), (start, end, merged)


def union_by_points(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` the slow way: each one folded into a list of disjoint ones."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end < start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def test_merge_gives_the_union_and_keeps_the_tuples_it_was_given():
    rng = random.Random(11)
    for _ in range(2000):
        intervals: list = []
        for _ in range(rng.randint(0, 12)):
            start = rng.choice([0, 1, 2, 2.5, 4, 7, 10])
            intervals.append((start, start + rng.choice([-1, 0, 0.5, 1, 3, 8])))  # -1: reversed
        if rng.random() < 0.2:
            intervals = [list(i) for i in intervals]  # not tuples: copied as tuples
        merged = merge(iter(intervals))
        assert merged == union_by_points(intervals), intervals
        assert all(type(m) is tuple for m in merged)
    alone, later = (0.0, 1.0), (2.0, 3.0)
    assert [m is g for m, g in zip(merge([later, alone]), (alone, later), strict=True)] == [True, True]
