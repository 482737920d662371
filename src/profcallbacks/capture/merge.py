"""One trace of all ranks of a capture, each rank a process track, clocks aligned on collectives.

Each rank's clock is its host's: CUPTI and wall clocks differ by up to hundreds of microseconds
across hosts, so ranks glued side by side misplace every collective. A collective ends at about
the same moment on every rank (none can finish before the last one joined), so the merge shifts
each rank by the median difference between its collective ends and the lowest rank's: the k-th
NCCL kernel of each name on GPU traces, the k-th ``gloo:`` operation of each name on CPU traces.
What is left (the ends' spread after the shift) is the residual skew, recorded per rank.

Memory stays at one rank's trace: a first pass reads each file for its clock, collectives, steps
and event durations, a second reads each again and streams its events into the gzip output. When
the merged file would exceed the byte budget, later steps are left out first, then short events
(never step markers or collectives); the file's ``profcallbacks_merge`` block says what was left.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import statistics
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profcallbacks.capture.export import GZIP_LEVEL, _decode, _encode
from profcallbacks.capture.trimming import FILL

_STEP = "ProfilerStep#"
_CHUNK_EVENTS = 20_000


@dataclass
class _Rank:
    """What the first pass learned about one rank's file."""

    path: Path
    rank: int
    host: str
    base_us: float
    size: int
    collectives: dict[tuple[str, int], float] = field(default_factory=dict)  # key -> end (us)
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (start, end)
    durations: array = field(default_factory=lambda: array("d"))
    offset_us: float = 0.0


def is_collective(event: dict[str, Any]) -> str | None:
    """``"gpu"`` for an NCCL kernel, ``"cpu"`` for a gloo operation, else ``None``."""
    name = event.get("name")
    if not isinstance(name, str):
        return None
    if event.get("cat") == "kernel" and name.startswith("nccl"):
        return "gpu"
    if name.startswith("gloo:"):
        return "cpu"
    return None


def merge_capture(files: list[Path], out: Path, *, budget_bytes: int | None) -> dict[str, Any]:
    """Writes the merged trace of ``files`` (one per rank) to ``out``; returns its metadata.

    Raises:
        OSError: A file could not be read or the output written (nothing is left half written).
        ValueError: A file is not a trace.
    """
    ranks = sorted((_first_pass(path) for path in files), key=lambda r: r.rank)
    alignment = _align(ranks)
    total_events = sum(len(r.durations) for r in ranks)
    est = sum(r.size for r in ranks)
    keep_steps, min_dur = _reduction(ranks, est, total_events, budget_bytes)
    window = _step_window(ranks, keep_steps)
    meta: dict[str, Any] = {
        "ranks": [{"rank": r.rank, "host": r.host, "file": r.path.name,
                   "offset_us": round(r.offset_us, 3),
                   "residual_skew_us": alignment["residual"].get(r.rank)} for r in ranks],
        "aligned_on": alignment["on"], "collectives_matched": alignment["matched"],
        "max_residual_skew_us": alignment["max_residual"],
        "capture_bytes": budget_bytes, "input_bytes": est,
        "steps_kept": keep_steps, "min_event_us": min_dur,
        "reduced": bool(min_dur) or keep_steps != _all_steps(ranks),
    }
    writing = out.with_name(f".{out.name}.writing")
    base_us = ranks[0].base_us if ranks else 0.0
    try:
        fd = os.open(writing, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o644)
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                                       compresslevel=GZIP_LEVEL) as gz:
            head = _encode({"profcallbacks_merge": meta, "displayTimeUnit": "ms",
                            "baseTimeNanoseconds": int(base_us * 1000)})
            gz.write(head[:-1] + b',"traceEvents":[')
            first = True
            for r in ranks:
                for chunk in _rank_events(r, base_us, window, min_dur):
                    if chunk:
                        gz.write((b"" if first else b",") + b",".join(map(_encode, chunk)))
                        first = False
            gz.write(b"]}")
        os.replace(writing, out)
    finally:
        with contextlib.suppress(OSError):
            writing.unlink()
    meta["bytes"] = out.stat().st_size
    return meta


def _first_pass(path: Path) -> _Rank:
    trace = _load(path)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace")
    meta = trace.get("profcallbacks") or {}
    dist = trace.get("distributedInfo") or {}
    rank = int(meta.get("rank", dist.get("rank", 0)))
    host = str(meta.get("host") or trace.get("host_name") or "?")
    info = _Rank(path, rank, host, int(trace.get("baseTimeNanoseconds", 0)) / 1000.0,
                 path.stat().st_size)
    kind_events: dict[str, list[tuple[float, float, str]]] = {"gpu": [], "cpu": []}
    for event in trace["traceEvents"]:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        ts, dur = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        info.durations.append(dur)
        name = event.get("name")
        if isinstance(name, str) and name.startswith(_STEP):
            with contextlib.suppress(ValueError):
                info.steps[int(name[len(_STEP):])] = (ts + info.base_us, ts + dur + info.base_us)
        kind = is_collective(event)
        if kind is not None:
            kind_events[kind].append((ts + info.base_us, ts + dur + info.base_us, str(name)))
    kind = "gpu" if kind_events["gpu"] else "cpu"
    counts: dict[str, int] = {}
    for _, end, name in sorted(kind_events[kind]):
        k = counts[name] = counts.get(name, -1) + 1
        info.collectives[(f"{kind}:{name}", k)] = end
    return info


def _align(ranks: list[_Rank]) -> dict[str, Any]:
    """Sets each rank's ``offset_us`` so its collective ends meet the lowest rank's."""
    out: dict[str, Any] = {"on": None, "matched": 0, "residual": {}, "max_residual": None}
    if len(ranks) < 2:
        return out
    ref = ranks[0]
    keys = set(ref.collectives)
    for r in ranks[1:]:
        keys &= set(r.collectives)
    if not keys:
        return out
    out["on"] = sorted({k[0] for k in keys})
    out["matched"] = len(keys)
    residuals: list[float] = []
    for r in ranks:
        deltas = [ref.collectives[k] - r.collectives[k] for k in keys]
        r.offset_us = statistics.median(deltas)
        spread = [abs(r.collectives[k] + r.offset_us - ref.collectives[k]) for k in keys]
        out["residual"][r.rank] = {"median": round(statistics.median(spread), 3),
                                   "max": round(max(spread), 3)}
        residuals.append(max(spread))
    out["max_residual"] = round(max(residuals), 3)
    return out


def _all_steps(ranks: list[_Rank]) -> list[int]:
    return sorted(set().union(*(r.steps for r in ranks))) if ranks else []


def _reduction(ranks: list[_Rank], est: int, total: int,
               budget: int | None) -> tuple[list[int], float]:
    """The steps to keep and the shortest event duration kept (0: all) to fit ``budget``."""
    steps = _all_steps(ranks)
    if budget is None or est <= budget * FILL or total == 0:
        return steps, 0.0
    share = budget * FILL / est
    if len(steps) > 1:
        keep = max(1, math.floor(len(steps) * share))
        share = share * len(steps) / keep
        steps = steps[:keep]
    if share >= 1.0:
        return steps, 0.0
    durations = sorted(d for r in ranks for d in r.durations)
    cut = durations[min(len(durations) - 1, int(len(durations) * (1.0 - share)))]
    return steps, max(cut, 1e-3)


def _step_window(ranks: list[_Rank], steps: list[int]) -> tuple[float, float] | None:
    """Aligned time span of ``steps`` on every rank, or ``None`` when every step is kept."""
    if not steps or steps == _all_steps(ranks):
        return None
    starts = [r.steps[s][0] + r.offset_us for r in ranks for s in steps if s in r.steps]
    ends = [r.steps[s][1] + r.offset_us for r in ranks for s in steps if s in r.steps]
    return (min(starts), max(ends)) if starts else None


def _rank_events(r: _Rank, base_us: float, window: tuple[float, float] | None,
                 min_dur: float) -> Any:
    """The rank's events, shifted and renamed, in chunks (its trace is read again here)."""
    trace = _load(r.path)
    shift = r.base_us - base_us + r.offset_us
    pid = r.rank + 1
    tids: dict[tuple[Any, Any], int] = {}
    process_names: dict[Any, str] = {}
    events = trace["traceEvents"]
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "M" and event.get("name") == "process_name":
            process_names[event.get("pid")] = str((event.get("args") or {}).get("name", ""))
    chunk: list[Any] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"rank {r.rank} ({r.host})"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": r.rank}}]
    main_pid = next((e.get("pid") for e in events if isinstance(e, dict)
                     and str(e.get("name", "")).startswith(_STEP)), None)
    for event in events:
        if not isinstance(event, dict):
            continue
        ph = event.get("ph")
        if ph == "M" and event.get("name", "").startswith("process_"):
            continue
        key = (event.get("pid"), event.get("tid"))
        if key not in tids:
            tids[key] = len(tids) + 1
            if key[0] != main_pid and ph != "M":
                chunk.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[key],
                              "args": {"name": f"{process_names.get(key[0], key[0])} {key[1]}"}})
        if "ts" in event and ph != "M":
            ts = float(event["ts"]) + shift
            if ph == "X" and not _kept(event, ts + base_us, window, min_dur):
                continue
            event["ts"] = round(ts, 3)
        if "id" in event and isinstance(event["id"], int):
            event["id"] = event["id"] * 1024 + r.rank  # flow ids stay unique across ranks
        event["pid"], event["tid"] = pid, tids[key]
        chunk.append(event)
        if len(chunk) >= _CHUNK_EVENTS:
            yield chunk
            chunk = []
    yield chunk


def _kept(event: dict[str, Any], ts_abs: float, window: tuple[float, float] | None,
          min_dur: float) -> bool:
    name = event.get("name")
    if (isinstance(name, str) and name.startswith(_STEP)) or is_collective(event):
        return window is None or (window[0] <= ts_abs <= window[1])
    if window is not None and not (window[0] <= ts_abs <= window[1]):
        return False
    return float(event.get("dur", 0.0)) >= min_dur


def _load(path: Path) -> Any:
    with open(path, "rb") as raw:
        data = gzip.GzipFile(fileobj=raw).read() if path.suffix == ".gz" else raw.read()
    return _decode(data)
