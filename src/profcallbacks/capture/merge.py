"""One trace of all ranks of a capture, each rank a process track, clocks aligned on collectives.

Each rank's clock is its host's: CUPTI and wall clocks differ by up to hundreds of microseconds
across hosts, so ranks glued side by side misplace every collective. Ranks of one host share its
clock and keep it. A collective ends at about the same moment on every rank (none can finish
before the last one joined), so the merge shifts each other host's ranks by the densest half of
the differences between their collective ends and the lowest rank's: the k-th NCCL kernel of
each name on GPU traces, the k-th ``gloo:`` operation of each name on CPU traces.
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

from profcallbacks.capture.trace_writer import GZIP_LEVEL
from profcallbacks.capture.trimming import FILL
from profcallbacks.core.json_codec import dumps_compact, loads
from profcallbacks.core.safefs import create_exclusive, fresh_name, read_regular, remove_own
from profcallbacks.core.trace_names import GLOO_PREFIX, KERNEL, NCCL_KERNEL_PREFIX
from profcallbacks.core.trace_names import STEP_PREFIX as _STEP

_CHUNK_EVENTS = 20_000
MAX_INPUT_BYTES = 1 << 32
"""Largest rank file merged (4 GiB on disk)."""
ATTEMPTS = 3
"""Writes of the merged trace at most, each reduced by what the last one measured."""


UNKNOWN_HOSTS = frozenset({"", "?", "localhost"})
"""Host names that may stand for more than one machine: such ranks are aligned one by one."""


@dataclass
class _Rank:
    """What the first pass learned about one rank's file."""

    path: Path
    rank: int
    host: str
    base_us: float
    size: int
    collectives: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    """(kind:name, k) -> (start, end) in microseconds on the rank's clock."""
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)  # step -> (start, end)
    durations: array = field(default_factory=lambda: array("d"))
    offset_us: float = 0.0


def is_collective(event: dict[str, Any]) -> str | None:
    """``"gpu"`` for an NCCL kernel, ``"cpu"`` for a gloo operation, else ``None``."""
    name = event.get("name")
    if not isinstance(name, str):
        return None
    if event.get("cat") == KERNEL and name.startswith(NCCL_KERNEL_PREFIX):
        return "gpu"
    if name.startswith(GLOO_PREFIX):
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
    meta: dict[str, Any] = {}
    for _ in range(ATTEMPTS):  # the output compresses unlike its inputs: measure, then retry
        keep_steps, min_dur = _reduction(ranks, est, total_events, budget_bytes)
        meta = {
            "ranks": [{"rank": r.rank, "host": r.host, "file": r.path.name,
                       "offset_us": round(r.offset_us, 3),
                       "residual_skew_us": alignment["residual"].get(r.rank)} for r in ranks],
            "aligned_on": alignment["on"], "collectives_matched": alignment["matched"],
            "max_residual_skew_us": alignment["max_residual"],
            "capture_bytes": budget_bytes, "input_bytes": sum(r.size for r in ranks),
            "steps_kept": keep_steps, "min_event_us": min_dur,
            "reduced": bool(min_dur) or keep_steps != _all_steps(ranks),
        }
        meta["bytes"] = _write(ranks, out, meta, keep_steps, min_dur)
        if budget_bytes is None or meta["bytes"] <= budget_bytes:
            break
        est = est * meta["bytes"] / max(budget_bytes * FILL, 1.0) * 1.1
    meta["over_budget"] = budget_bytes is not None and meta["bytes"] > budget_bytes
    return meta


def _write(ranks: list[_Rank], out: Path, meta: dict[str, Any], steps: list[int],
           min_dur: float) -> int:
    """Streams the merged trace into ``out`` (replaced whole, never half written); its bytes."""
    writing = out.with_name(fresh_name(f".{out.name}.") + ".writing")
    base_us = ranks[0].base_us if ranks else 0.0
    try:
        fd = create_exclusive(writing)  # no link followed, nothing overwritten
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb",
                                                       compresslevel=GZIP_LEVEL) as gz:
            head = dumps_compact({"profcallbacks_merge": meta, "displayTimeUnit": "ms",
                            "baseTimeNanoseconds": int(base_us * 1000)})
            gz.write(head[:-1] + b',"traceEvents":[')
            first = True
            for r in ranks:
                for chunk in _rank_events(r, base_us, _step_window(r, steps), min_dur):
                    if chunk:
                        gz.write((b"" if first else b",") + b",".join(map(dumps_compact, chunk)))
                        first = False
            gz.write(b"]}")
        if out.is_symlink():
            raise FileExistsError(out)  # a link planted where the merged file goes: left alone
        os.replace(writing, out)
    finally:
        with contextlib.suppress(OSError):
            remove_own(writing, kind="file")
    return out.stat().st_size


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
    for start, end, name in sorted(kind_events[kind]):
        k = counts[name] = counts.get(name, -1) + 1
        info.collectives[(f"{kind}:{name}", k)] = (start, end)
    return info


def _align(ranks: list[_Rank]) -> dict[str, Any]:
    """Sets each rank's ``offset_us`` so its collective ends meet the lowest rank's.

    Ranks of one host share its clock: they keep it (no shift on the lowest rank's host), and
    each other host gets one shift for all its ranks. A rank whose host is unknown gets its own.
    The shift is the densest half of the end differences (the median of the shortest run of
    half of them, sorted): most collectives end within microseconds on every rank, while a rank
    descheduled before it records an end shows it milliseconds late, and those outliers pull a
    median or a mean but not the densest half. (On one host, shifting each rank by its own ends
    only added that noise: beside two CPU-burning processes, 2.4 ms for one of four gloo ranks
    that shared the clock.)
    """
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
    clocks: dict[str, list[_Rank]] = {}
    for r in ranks:
        clocks.setdefault(r.host if r.host not in UNKNOWN_HOSTS else f"\0{r.rank}", []).append(r)
    for sharing in clocks.values():
        shift = 0.0 if any(r is ref for r in sharing) else densest_half(
            [ref.collectives[k][1] - r.collectives[k][1] for r in sharing for k in keys])
        for r in sharing:
            r.offset_us = shift
    residuals: list[float] = []
    for r in ranks:
        pairs = [(ref.collectives[k], r.collectives[k]) for k in keys]
        spread = [abs(b[1] + r.offset_us - a[1]) for a, b in pairs]
        out["residual"][r.rank] = {"median": round(statistics.median(spread), 3),
                                   "max": round(max(spread), 3)}
        residuals.append(max(spread))
    out["max_residual"] = round(max(residuals), 3)
    return out


def densest_half(values: list[float]) -> float:
    """The median of the ``ceil(n / 2)`` consecutive sorted values that span the least range.

    Example:
        >>> densest_half([-2831, -1943, -243, -112, -89, -2, 2, 70, 89, 1744, 4094, 5281])
        0.0
    """
    ordered = sorted(values)
    h = (len(ordered) + 1) // 2
    start = min(range(len(ordered) - h + 1), key=lambda i: ordered[i + h - 1] - ordered[i])
    return float(statistics.median(ordered[start:start + h]))


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


def _step_window(r: _Rank, steps: list[int]) -> tuple[float, float, frozenset[int]] | None:
    """The rank's own clock span of ``steps`` and the steps, or ``None`` when it keeps all."""
    if not steps or set(steps) >= set(r.steps):
        return None
    spans = [r.steps[s] for s in steps if s in r.steps]
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans), frozenset(steps)


def _rank_events(r: _Rank, base_us: float, window: tuple[float, float, frozenset[int]] | None,
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
            ts = float(event["ts"])
            if ph == "X" and not _kept(event, ts + r.base_us, window, min_dur):
                continue  # on the rank's own clock, as the first pass measured the steps
            event["ts"] = round(ts + shift, 3)
        if "id" in event and isinstance(event["id"], int):
            event["id"] = event["id"] * 1024 + r.rank  # flow ids stay unique across ranks
        event["pid"], event["tid"] = pid, tids[key]
        chunk.append(event)
        if len(chunk) >= _CHUNK_EVENTS:
            yield chunk
            chunk = []
    yield chunk


def _kept(event: dict[str, Any], ts_abs: float,
          window: tuple[float, float, frozenset[int]] | None, min_dur: float) -> bool:
    name = event.get("name")
    if isinstance(name, str) and name.startswith(_STEP):
        return window is None or name[len(_STEP):] in {str(s) for s in window[2]}
    if window is not None and not (window[0] <= ts_abs < window[1]):
        return False
    return is_collective(event) is not None or float(event.get("dur", 0.0)) >= min_dur


def _load(path: Path) -> Any:
    data = read_regular(path, max_bytes=MAX_INPUT_BYTES)  # a regular file: never through a link
    return loads(gzip.decompress(data) if path.suffix == ".gz" else data)
