"""The run's findings as a track of their own in a capture's trace, where Perfetto shows them.

A user who opens a capture in Perfetto or TensorBoard's trace view sees the findings on the
timeline, beside the steps they are about, instead of finding them again by hand:

- a process ``profcallbacks findings (rank R)``, sorted above the others, one thread per kind;
- a slice per finding that covers steps (a stall episode's ``first_step``-``last_step``), over the
  captured part of those steps; a stall episode not cleared when the window closed holds on
  through the capture, and one cleared later ends at the cleared finding's ``last_step``;
- an instant per sync point, at the start of each captured step it recurs in (at its own step when
  that was captured), named by its ``file:line``;
- the capture's verdict as a slice over the captured steps, and one slice per diagnosis;
- the whole text of each in ``args``.

The events use the category :data:`TRACK_CATEGORY`, which the report and HTA leave out of every
number. Pure: plain dicts in, Chrome trace events out; :func:`capture_track` reads them off a
capture's :class:`~profcallbacks.core.capture_info.CaptureInfo` and its live findings, and
:func:`append_events` adds them to an encoded trace.

Example:
    >>> steps = [(31, 0.0, 50.0), (32, 50.0, 101.0)]
    >>> stall = {"kind": "dataloader_stall", "step": 40, "rank": 0, "severity": "warning",
    ...          "message": "66% of step time waiting", "details": {"first_step": 1, "last_step": 40}}
    >>> events = findings_track(steps, [stall], rank=0)
    >>> [(e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
    [('dataloader_stall', 0.0, 101.0)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from profcallbacks.capture.worker_tracks import worker_track
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.trace_names import FINDINGS_TRACK
from profcallbacks.findings import (
    CAPTURE_VERDICT,
    DATALOADER_STALL,
    DATALOADER_STALL_CLEARED,
    SYNC_POINT,
    Finding,
)

TRACK_CATEGORY = FINDINGS_TRACK
"""Category of every event of the findings track."""
TRACK_PID = 1 << 30
"""Process id of the findings track: far above real process ids, so it never joins one."""

MAX_FINDINGS = 500
"""A capture carries at most this many of its rank's latest findings to its track."""

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
    mine = [f for f in findings if f.get("rank") == rank]
    ends = _episode_ends(mine)
    for finding in mine:
        if finding.get("kind") == DATALOADER_STALL_CLEARED and _first(finding) in ends:
            continue  # its episode's slice ends where it says
        event = _finding_event(finding, bounds, steps, ends)
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


def capture_track(info: CaptureInfo, base_ns: int, found: Sequence[Finding]) -> list[dict[str, Any]]:
    """The findings track of the capture ``info``: the run's findings it carries, and the verdict
    and diagnoses of its live analysis (``found``, its ``capture_verdict`` among them); then the
    loader workers' tracks (:mod:`~profcallbacks.capture.worker_tracks`).

    Args:
        info: The capture window, with the run's findings when it closed.
        base_ns: The trace's ``baseTimeNanoseconds`` (event times are microseconds after it).
        found: Findings of the capture's live analysis.
    """
    steps = [(span.step, (span.start_ns - base_ns) / 1000.0, (span.end_ns - base_ns) / 1000.0)
             for span in info.steps]
    verdict = next((f.details for f in found if f.kind == CAPTURE_VERDICT), None)
    diagnoses = [d for d in (verdict or {}).get("diagnoses") or [] if isinstance(d, dict)]
    return findings_track(steps, info.findings, rank=info.rank.rank, verdict=verdict,
                          diagnoses=diagnoses) + worker_track(info.loader, base_ns,
                                                              rank=info.rank.rank)


def append_events(encoded: bytes, events: Sequence[dict[str, Any]]) -> bytes:
    """``encoded`` (a compact JSON trace whose last key is ``traceEvents``) with ``events`` at the
    end of its events; ``encoded`` itself where there are none or it does not end that way."""
    if not events or not encoded.endswith(b"]}"):
        return encoded
    extra = json.dumps(_finite(list(events)), separators=(",", ":"), default=str,
                       allow_nan=False).encode()[1:-1]
    empty = encoded[:-2].rstrip().endswith(b"[")
    return encoded[:-2] + (b"" if empty else b",") + extra + b"]}"


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``null`` (JSON has no word for them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _first(finding: dict[str, Any]) -> Any:
    details = finding.get("details")
    return details.get("first_step") if isinstance(details, dict) else None


def _episode_ends(findings: Sequence[dict[str, Any]]) -> dict[Any, float]:
    """The last step of each stall episode (by its first step): where it cleared, or infinity
    while it holds."""
    ends: dict[Any, float] = {}
    for finding in findings:
        first = _first(finding)
        if not isinstance(first, int):
            continue
        if finding.get("kind") == DATALOADER_STALL:
            ends.setdefault(first, math.inf)
        elif finding.get("kind") == DATALOADER_STALL_CLEARED and first in ends:
            last = (finding.get("details") or {}).get("last_step")
            ends[first] = float(last) if isinstance(last, int) else math.inf
    return ends


def _finding_event(finding: dict[str, Any], bounds: dict[int, tuple[float, float]],
                   steps: Sequence[Step], ends: dict[Any, float]) -> dict[str, Any] | None:
    """A slice over the captured steps a finding covers, an instant for a sync point, or None."""
    raw = finding.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    step = finding.get("step")
    first, last = details.get("first_step"), details.get("last_step")
    if finding.get("kind") == DATALOADER_STALL and isinstance(first, int):
        last = ends.get(first, last)  # still holding when the window closed, or where it cleared
    kind = str(finding.get("kind"))
    if kind == SYNC_POINT:
        where = str(details.get("location") or "sync point")
        at = bounds.get(step) if isinstance(step, int) else None
        if at is None and not details.get("calls_per_step"):
            return None
        ts = at[0] if at is not None else steps[0][1]  # a per-step sync recurs in every step
        return {"ph": "i", "s": "t", "cat": TRACK_CATEGORY, "name": f"sync: {where}", "pid": TRACK_PID,
                "ts": ts, "args": _args(finding)}
    if isinstance(first, int) and isinstance(last, (int, float)):
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
