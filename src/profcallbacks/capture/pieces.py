"""Joins the traces kineto saved one after another in one process into the trace of one capture.

A run's first capture records its first step with a profiler of its own, saved at once so that
its size predicts the rest of the window (``budget.CaptureBudget``); the rest of the window is a
second profiler. Both are the same process, clock and options, so joining them is concatenation,
with three things made whole again:

- numbers kineto restarts per profiler (``Python id`` and ``Python parent id`` of Python frames,
  ``Ev Idx``, the ids of ``fwdbwd`` flows) are moved past the earlier pieces' largest;
- timestamps are relative to each piece's ``baseTimeNanoseconds``: moved to the first piece's;
- the per-profiler bookkeeping events (process and thread names, the ``PyTorch Profiler`` span,
  the iteration and window instants) appear once, the span covering every piece.

Correlation ids (``External id``, ``correlation``, ``ac2g`` flows) are process-wide in kineto
and stay as they are.
"""

from __future__ import annotations

from typing import Any

RESTARTED_ARGS = {"Python id": "Python id", "Python parent id": "Python id", "Ev Idx": "Ev Idx"}
"""Event arguments each profiler numbers from 0 or 1 again, with the numbering each belongs to."""
RESTARTED_FLOWS = ("fwdbwd",)
"""Flow categories whose ids each profiler numbers from 1 again."""
FIRST_ONLY = "Iteration Start: PyTorch Profiler"
LAST_ONLY = "Record Window End"


def stitch(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace from ``pieces`` (kineto traces of one process, in the order they were saved).

    Example:
        >>> a = {"baseTimeNanoseconds": 0, "traceEvents": [
        ...     {"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 1.0, "args": {"Ev Idx": 0}}]}
        >>> b = {"baseTimeNanoseconds": 1000, "traceEvents": [
        ...     {"ph": "X", "name": "aten::mm", "ts": 5.0, "dur": 1.0, "args": {"Ev Idx": 0}}]}
        >>> [(e["ts"], e["args"]["Ev Idx"]) for e in stitch([a, b])["traceEvents"]]
        [(1.0, 0), (6.0, 1)]
    """
    trace = pieces[0]
    events: list[dict[str, Any]] = trace.setdefault("traceEvents", [])
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    seen_metadata = {_metadata_key(e) for e in events if e.get("ph") == "M"}
    span = next((e for e in events if e.get("cat") == "Trace"), None)
    for later in pieces[1:]:
        shift_us = (int(later.get("baseTimeNanoseconds", 0)) - base_ns) / 1000.0
        offsets = _next_numbers(events)
        events[:] = [e for e in events if e.get("name") != LAST_ONLY]
        for event in later.get("traceEvents", []):
            if event.get("ph") == "M":
                key = _metadata_key(event)
                if key in seen_metadata:
                    continue
                seen_metadata.add(key)
            if event.get("name") == FIRST_ONLY:
                continue
            if shift_us and isinstance(event.get("ts"), (int, float)):
                event["ts"] += shift_us
            if event.get("cat") == "Trace" and span is not None:
                _cover(span, event)
                continue
            _renumber(event, offsets)
            events.append(event)
    return trace


def _metadata_key(event: dict[str, Any]) -> tuple[Any, ...]:
    return (event.get("name"), event.get("pid"), event.get("tid"), repr(event.get("args")))


def _next_numbers(events: list[dict[str, Any]]) -> dict[str, int]:
    """For each numbering a profiler restarts, one past its largest value in ``events``."""
    offsets = dict.fromkeys([*RESTARTED_ARGS.values(), *RESTARTED_FLOWS], 0)
    for event in events:
        args = event.get("args")
        if isinstance(args, dict):
            for name, numbering in RESTARTED_ARGS.items():
                value = args.get(name)
                if isinstance(value, int) and value >= offsets[numbering]:
                    offsets[numbering] = value + 1
        cat, value = event.get("cat"), event.get("id")
        if cat in RESTARTED_FLOWS and isinstance(value, int) and value >= offsets[cat]:
            offsets[cat] = value + 1
    return offsets


def _renumber(event: dict[str, Any], offsets: dict[str, int]) -> None:
    args = event.get("args")
    if isinstance(args, dict):
        for name, numbering in RESTARTED_ARGS.items():
            value = args.get(name)
            if isinstance(value, int):  # a root frame's parent is null: it stays null
                args[name] = value + offsets[numbering]
    cat, value = event.get("cat"), event.get("id")
    if cat in RESTARTED_FLOWS and isinstance(value, int):
        event["id"] = value + offsets[cat]


def _cover(span: dict[str, Any], later: dict[str, Any]) -> None:
    """Widen the first piece's ``PyTorch Profiler`` span to the end of a later piece's."""
    start, duration = later.get("ts"), later.get("dur")
    if isinstance(start, (int, float)) and isinstance(duration, (int, float)):
        span["dur"] = max(span.get("dur", 0), start + duration - span.get("ts", start))
