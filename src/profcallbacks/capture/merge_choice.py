"""Which ranks a large capture's merged trace holds: the slowest, and one median rank to compare.

A merged trace of thousands of ranks is neither viewable nor within any byte budget. Above
``MERGE_ALL_UP_TO`` ranks the merged trace holds the ``SLOWEST`` ranks that spent the most of
their step outside collective waits (the ranks the others wait for) and the median rank, read
from the summaries written next to the traces (``capture/summary_file.py``); ranks without a
matching summary are left out of the ranking. Without any summary, every trace is merged as
before (the byte budget then reduces the steps kept).

Example:
    >>> merge_choice([]) == []
    True
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from profcallbacks.capture.summary_file import MATCH, load_summary

MERGE_ALL_UP_TO = 16
"""Captures of this many ranks or fewer merge every rank."""
SLOWEST = 4
"""Ranks merged for their own time per step (the stragglers), besides the median one."""


def busy_ms(record: dict[str, Any]) -> float | None:
    """A rank's time per step outside collective waits (ms), from its summary record."""
    metrics = (record.get("analysis") or {}).get("metrics") or {}
    step = metrics.get("step_ms")
    if not isinstance(step, (int, float)) or step <= 0:
        return None
    steps = max(len(record.get("steps") or []), 1)
    waits = sum(float(c[2]) for c in record.get("collectives") or [])
    return float(step) - waits / steps


def merge_choice(traces: list[Path]) -> list[Path]:
    """The traces to merge: all up to ``MERGE_ALL_UP_TO``; beyond, the ``SLOWEST`` busiest
    ranks and the median one (by the summaries), in the given order."""
    if len(traces) <= MERGE_ALL_UP_TO:
        return list(traces)
    busy: dict[Path, float] = {}
    for trace in traces:
        loaded = load_summary(trace)
        if loaded.status == MATCH and loaded.record is not None:
            value = busy_ms(loaded.record)
            if value is not None:
                busy[trace] = value
    if len(busy) < 2:
        return list(traces)
    ranked = sorted(busy, key=lambda t: -busy[t])
    median = statistics.median_low(busy.values())
    middle = next(t for t in ranked if busy[t] == median)
    chosen = set(ranked[:SLOWEST]) | {middle}
    return [t for t in traces if t in chosen]
