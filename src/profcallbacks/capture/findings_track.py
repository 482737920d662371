"""The run's findings as a track of their own in a capture's trace, where Perfetto shows them.

A user who opens a capture in Perfetto or TensorBoard's trace view sees the findings on the
timeline, beside the steps they are about, instead of finding them again by hand:

- a process ``profcallbacks findings (rank R)``, sorted above the others, one thread per kind;
- a slice per finding that covers steps (a stall episode's ``first_step``-``last_step``), over the
  captured part of those steps;
- an instant per sync point, at the start of each captured step it recurs in (at its own step when
  that was captured), named by its ``file:line``;
- the capture's verdict as a slice over the captured steps, and one slice per diagnosis;
- the whole text of each in ``args``.

The events use the category :data:`TRACK_CATEGORY`, which the report and HTA leave out of every
number. Pure: plain dicts in, Chrome trace events out.

Example:
    >>> steps = [(31, 0.0, 50.0), (32, 50.0, 101.0)]
    >>> stall = {"kind": "dataloader_stall", "step": 40, "rank": 0, "severity": "warning",
    ...          "message": "66% of step time waiting", "details": {"first_step": 1, "last_step": 40}}
    >>> events = findings_track(steps, [stall], rank=0)
    >>> [(e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
    [('dataloader_stall', 0.0, 101.0)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from profcallbacks.findings import SYNC_POINT

TRACK_CATEGORY = "profcallbacks_finding"
"""Category of every event of the findings track."""
TRACK_PID = 1 << 30
"""Process id of the findings track: far above real process ids, so it never joins one."""

_VERDICT_TID = 1
_DIAGNOSES_TID = 2

Step = tuple[int, float, float]
"""A captured step: its number, start and end in the trace's microseconds."""


def findings_track(steps: Sequence[Step], findings: Sequence[dict[str, Any]], *, rank: int,
                   verdict: dict[str, Any] | None = None,
                   diagnoses: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The Chrome trace events of the findings track of one rank's capture.

    Args:
        steps: The captured steps, in order, with their bounds in the trace's microseconds.
        findings: The run's findings so far (``Finding.to_dict()`` rows); those of other ranks and
            those about steps outside the capture are left out.
        rank: The capture's rank.
        verdict: The capture's verdict (``kind``, ``share``, ``evidence``, ``advice``), if any.
        diagnoses: The capture's diagnoses (``kind``, ``gain_ms``, ``fix`` ...), largest first.

    Returns:
        Metadata and events; none at all when there is nothing to show or no captured step.
    """
    if not steps:
        return []
    bounds = {number: (start, end) for number, start, end in steps}
    start, end = steps[0][1], steps[-1][2]
    rows: dict[int, list[dict[str, Any]]] = {}
    names: dict[int, str] = {}
    if verdict is not None and verdict.get("kind"):
        share = verdict.get("share")
        label = f"verdict: {verdict['kind']}" + (f" ({share:.0%})" if isinstance(share, float) else "")
        rows[_VERDICT_TID] = [_slice(label, start, end, verdict)]
        names[_VERDICT_TID] = "verdict"
    if diagnoses:
        rows[_DIAGNOSES_TID] = [_slice(_diagnosis_label(d), start, end, d) for d in diagnoses]
        names[_DIAGNOSES_TID] = "diagnoses"
    kinds: dict[str, int] = {}
    for finding in findings:
        if finding.get("rank") != rank:
            continue
        event = _finding_event(finding, bounds, steps)
        if event is None:
            continue
        kind = str(finding.get("kind"))
        tid = kinds.setdefault(kind, _DIAGNOSES_TID + 1 + len(kinds))
        names[tid] = kind
        rows.setdefault(tid, []).append(event)
    if not rows:
        return []
    out = [_meta("process_name", 0, {"name": f"profcallbacks findings (rank {rank})"}),
           _meta("process_sort_index", 0, {"sort_index": -1})]
    for tid in sorted(rows):
        out.append(_meta("thread_name", tid, {"name": names[tid]}))
        out.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
        out.extend(dict(event, tid=tid) for event in rows[tid])
    return out


def _finding_event(finding: dict[str, Any], bounds: dict[int, tuple[float, float]],
                   steps: Sequence[Step]) -> dict[str, Any] | None:
    """A slice over the captured steps a finding covers, an instant for a sync point, or None."""
    raw = finding.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    step = finding.get("step")
    first, last = details.get("first_step"), details.get("last_step")
    kind = str(finding.get("kind"))
    if kind == SYNC_POINT:
        where = str(details.get("location") or "sync point")
        at = bounds.get(step) if isinstance(step, int) else None
        if at is None and not details.get("calls_per_step"):
            return None
        ts = at[0] if at is not None else steps[0][1]  # a per-step sync recurs in every step
        return {"ph": "i", "s": "t", "cat": TRACK_CATEGORY, "name": f"sync: {where}", "pid": TRACK_PID,
                "ts": ts, "args": _args(finding)}
    if isinstance(first, int) and isinstance(last, int):
        covered = [(s, e) for n, s, e in steps if first <= n <= last]
    elif isinstance(step, int) and step in bounds:
        covered = [bounds[step]]
    else:
        covered = []
    if not covered:
        return None
    return _slice(kind, covered[0][0], covered[-1][1], _args(finding))


def _slice(name: str, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": TRACK_CATEGORY, "name": name, "pid": TRACK_PID, "ts": start,
            "dur": max(end - start, 0.0), "args": dict(args)}


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": TRACK_PID, "tid": tid, "args": args}


def _args(finding: dict[str, Any]) -> dict[str, Any]:
    return {"step": finding.get("step"), "severity": finding.get("severity"),
            "message": finding.get("message"), "details": finding.get("details") or {}}


def _diagnosis_label(diagnosis: dict[str, Any]) -> str:
    gain = diagnosis.get("gain_ms")
    return str(diagnosis.get("kind")) + (f" (up to {gain:.2f} ms/step)" if isinstance(gain, float)
                                         else "")
