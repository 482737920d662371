"""The loader workers on a capture's timeline: one track per worker, on the main process's clock.

Each worker's batches become slices ``fetch #12``, ``collate #12``, ``send #12`` (the batch's
index in its pass) on a thread of their own in a process ``profcallbacks loader workers
(rank R)``, and the loop's waits ``wait #12`` on a thread ``training loop waits`` above them,
so Perfetto shows, under a step waiting in ``enumerate(DataLoader)#...__next__``, which batch it
waited for and what its worker was doing. Worker times are ``perf_counter``
seconds (one clock for every process of the machine), moved onto the trace's wall clock here.
The events use the category :data:`~profcallbacks.core.trace_names.LOADER_WORKER_TRACK`, which
readers leave out of every number.

Example:
    >>> spans = [(0, 3, "fetch", 2_000_000, 5_000_000)]
    >>> [(e["name"], e["ts"], e["dur"]) for e in worker_track(spans, 1_000_000, rank=0)
    ...  if e["ph"] == "X"]
    [('fetch #3', 1000.0, 3000.0)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from profcallbacks.core.trace_names import LOADER_WORKER_TRACK

WORKERS_PID = (1 << 30) + 1
"""Process id of the workers' tracks: far above real process ids, beside the findings track."""
MAX_SPANS = 30_000
"""Most spans a capture carries (a long window of a fast loader)."""

Span = tuple[int, int, str, int, int]
"""A worker's span: worker, batch index, ``fetch``/``collate``/``send``, start and end (wall ns);
the loop's wait for a batch has the worker :data:`LOOP` and the phase ``wait``."""
LOOP = -1
"""The "worker" of the training loop's waits: a thread of its own, first."""


CLOCK_READS = 8
"""Pairs of clock readings :func:`wall_minus_perf_ns` takes; it keeps the tightest."""


def wall_minus_perf_ns(reads: int = CLOCK_READS) -> int:
    """``time.time_ns()`` less ``time.perf_counter_ns()`` now, from the tightest of ``reads``
    brackets (a ``perf_counter`` reading on each side of the wall clock's): a thread descheduled
    between two readings would put that whole wait into the offset (beside two CPU-burning
    processes, the workers' spans landed 0.8-1.0 ms off the trace's own ranges of the same
    fetches).
    """
    brackets = []
    for _ in range(max(reads, 1)):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        brackets.append((after - before, wall - (before + after) // 2))
    return min(brackets)[1]


def worker_spans(batches: Callable[[float, float], list[Any]], start_ns: int,
                 end_ns: int) -> tuple[Span, ...]:
    """The spans of the timed batches between ``start_ns`` and ``end_ns`` (``time.time_ns()``),
    from ``batches(start, end)`` (``LoaderWorkers.spans``: ``perf_counter`` seconds in and out).
    """
    offset = wall_minus_perf_ns()
    found = batches((start_ns - offset) / 1e9, (end_ns - offset) / 1e9)
    out: list[Span] = []
    for b in found:
        if getattr(b, "worker", None) is None:  # the training loop's wait for the batch
            out.append((LOOP, b.idx, "wait", int(b.start * 1e9) + offset,
                        int(b.end * 1e9) + offset))
            continue
        for phase, a, z in (("fetch", b.get, b.collate0), ("collate", b.collate0, b.collate1),
                            ("send", b.send0, b.send1)):
            if a > 0 and z >= a:
                out.append((b.worker, b.idx, phase, int(a * 1e9) + offset, int(z * 1e9) + offset))
    return tuple(out[-MAX_SPANS:])


def worker_track(spans: Sequence[Span], base_ns: int, *, rank: int) -> list[dict[str, Any]]:
    """The Chrome trace events of the workers' tracks (none when there are no spans).

    Args:
        spans: From :func:`worker_spans`.
        base_ns: The trace's ``baseTimeNanoseconds`` (event times are microseconds after it).
        rank: The capture's rank.
    """
    if not spans:
        return []
    out: list[dict[str, Any]] = [
        _meta("process_name", 0, {"name": f"profcallbacks loader workers (rank {rank})"}),
        _meta("process_sort_index", 0, {"sort_index": -1})]
    for worker in sorted({s[0] for s in spans}):
        name = "training loop waits" if worker == LOOP else f"DataLoader worker {worker}"
        out.append(_meta("thread_name", worker + 1, {"name": name}))
        out.append(_meta("thread_sort_index", worker + 1, {"sort_index": worker}))
    for worker, idx, phase, start, end in spans:
        out.append({"ph": "X", "cat": LOADER_WORKER_TRACK, "name": f"{phase} #{idx}",
                    "pid": WORKERS_PID, "tid": worker + 1, "ts": (start - base_ns) / 1000.0,
                    "dur": (end - start) / 1000.0,
                    "args": {"batch": idx, "worker": worker, "phase": phase}})
    return out


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": WORKERS_PID, "tid": tid, "args": args}
