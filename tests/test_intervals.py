"""``Spans.covered`` (columns, the summary's hot path) agrees with ``covered`` (lists) on any query."""

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
