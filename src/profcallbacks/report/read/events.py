"""One pass over a trace's events collecting what the GPU and host analyses need.

A 110 MB trace holds ~400k events; each Python pass over them costs about a second, so the GPU
breakdown (report/analyse/gpu_breakdown.py) and the host side (report/analyse/host_side.py) share
this one pass, which looks at an event's ``cat`` first and does the least work for the common
``cpu_op`` events.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from profcallbacks.core.trace_names import (
    ASYNC_COPY_CALL,
    CPU_OP,
    DEVICE_CATEGORIES,
    DEVICE_SYNCS,
    GPU_MEMCPY,
    HOST_CATEGORIES,
    LOADER_PREFIXES,
    MARKED_PREFIXES,
    OPTIMIZER_PREFIX,
    RUNTIME_CATEGORIES,
    STEP_PREFIX,
    SYNC_CALLS,
    TRACE_SPAN,
)
from profcallbacks.report.read.decode import MISSING, Args, Event

Interval = tuple[float, float]
Row = tuple[float, float, str, int, int]  # ts, end, name, stream, correlation (us)



@dataclass
class Scan:
    """What one pass over the events found (times in us, HTA-rounded for GPU rows)."""

    gpu: list[Row] = field(default_factory=list)
    host: list[tuple[float, int, bool]] = field(default_factory=list)  # ts, correlation, is a step
    step_names: set[str] = field(default_factory=set)
    steps: list[tuple[float, float, str, bool]] = field(default_factory=list)  # ts, end, name, ours
    syncs: list[tuple[float, float, str]] = field(default_factory=list)
    async_copies: dict[int, Interval] = field(default_factory=dict)
    blocking_copies: set[int] = field(default_factory=set)
    optimizer: list[Interval] = field(default_factory=list)
    comm: list[Interval] = field(default_factory=list)
    comm_ops: list[Interval] = field(default_factory=list)  # the cpu_op ones (the calling thread)
    data: list[Interval] = field(default_factory=list)
    ops: list[Interval] = field(default_factory=list)
    plain_ts: array[float] = field(default_factory=lambda: array("d"))  # other cpu_op events' ts
    plain_dur: array[float] = field(default_factory=lambda: array("d"))  # ... and their dur (>= 0)
    plain_other: list[tuple[Any, Any]] = field(default_factory=list)  # ts, dur not both floats
    lo: float = math.inf
    hi: float = -math.inf
    bad_dur: int = 0
    device_events: int = 0


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def scan(events: list[Any]) -> Scan:
    """One pass over decoded ``events`` (``decode.Event``; see the module docstring); faulty
    events are counted, skipped."""
    scanner = Scanner()
    scanner.add(events)
    return scanner.found


class Scanner:
    """:func:`scan` fed piece by piece (normalised pieces of a streamed trace, in file order);
    ``found`` is the scan of every piece added so far."""

    def __init__(self) -> None:
        self.found = Scan()

    def add(self, events: list[Any]) -> None:
        """Scans ``events`` (see the module docstring)."""
        out = self.found
        gpu, host, syncs, ops = out.gpu, out.host, out.syncs, out.ops
        lo, hi = out.lo, out.hi
        plain_ts, plain_dur, plain_other = out.plain_ts, out.plain_dur, out.plain_other
        for event in events:
            try:  # the common case without isinstance checks; anything odd takes the except path
                cat = event.cat
                if cat == CPU_OP:  # most events: keep ts and dur, look closer only when needed
                    name = event.name
                    if name not in SYNC_CALLS and not name.startswith(MARKED_PREFIXES):
                        ts, dur = event.ts, event.dur
                        if type(ts) is float and type(dur) is float and dur >= 0:
                            plain_ts.append(ts)
                            plain_dur.append(dur)
                        else:  # ints (kept as ints), or not numbers: checked when read
                            plain_other.append((ts, dur))
                        continue
                if event.ph != "X" or cat is MISSING:
                    continue
                ts, dur, name = event.ts, event.dur, event.name
                if not dur >= 0 or type(ts) is str or type(dur) is str or name is MISSING:
                    raise TypeError
                end = ts + dur
            except (KeyError, TypeError, IndexError, AttributeError):
                if (isinstance(event, Event) and event.ph == "X"
                        and event.cat not in (None, TRACE_SPAN, MISSING)):
                    out.bad_dur += 1
                continue
            if type(name) is not str:
                name = str(name)
            if cat == CPU_OP:
                if ts < lo:
                    lo = ts
                if end > hi:
                    hi = end
                if not name.startswith(MARKED_PREFIXES):
                    ops.append((ts, end))
                    syncs.append((ts, end, name))
                    continue
            if cat is None or cat == TRACE_SPAN:
                continue
            args = event.args
            if name.startswith(MARKED_PREFIXES) and cat in HOST_CATEGORIES:
                if ts < lo:
                    lo = ts
                if end > hi:
                    hi = end
                _marked(out, ts, end, name, args, cat)
                continue
            if cat in DEVICE_CATEGORIES:
                out.device_events += 1
            stream, corr = ((_int(args.stream), _int(args.correlation)) if isinstance(args, Args)
                            else (-1, -1))
            if cat in RUNTIME_CATEGORIES:
                if ts < lo:
                    lo = ts
                if end > hi:
                    hi = end
                if name in SYNC_CALLS:
                    syncs.append((ts, end, name))
                elif name == ASYNC_COPY_CALL and corr >= 0:
                    out.async_copies[corr] = (ts, end)
            elif cat == GPU_MEMCPY and corr >= 0 and ("DtoH" in name or "Pageable" in name):
                out.blocking_copies.add(corr)
            if isinstance(ts, float):  # ns resolution: whole microseconds inward, as HTA does
                ts, end = math.ceil(ts), math.floor(end)
            if (stream >= 0 and corr >= 0) or name in DEVICE_SYNCS:
                gpu.append((ts, end, name, stream, corr))
            else:
                if corr >= 0:
                    host.append((ts, corr, False))
                if stream >= 0:  # HTA counts these on the GPU timeline too
                    gpu.append((ts, end, name, stream, -1))
        out.lo, out.hi = lo, hi


def op_intervals(found: Scan) -> tuple[list[Interval], float, float]:
    """Every CPU operator's interval and the host span (``lo``, ``hi``), the plain operators
    included (only traces without step ranges need them)."""
    ops, lo, hi = list(found.ops), found.lo, found.hi
    for ts, dur in chain(zip(found.plain_ts, found.plain_dur, strict=True), found.plain_other):
        if isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and dur >= 0:
            end = ts + dur
            ops.append((ts, end))
            if ts < lo:
                lo = ts
            if end > hi:
                hi = end
    return ops, lo, hi


def _marked(out: Scan, ts: float, end: float, name: str, args: Any, cat: str) -> None:
    """A step range, dataloader fetch, optimizer step or communication call (any host category)."""
    if name.startswith(STEP_PREFIX):
        out.step_names.add(name)
        out.host.append((math.ceil(ts) if isinstance(ts, float) else ts, -1, True))
        out.steps.append((ts, end, name, isinstance(args, Args) and bool(args.profcallbacks)))
    elif name.startswith(LOADER_PREFIXES):
        out.data.append((ts, end))
    elif name.startswith(OPTIMIZER_PREFIX):
        out.optimizer.append((ts, end))
        out.ops.append((ts, end))
    else:
        out.comm.append((ts, end))
        if cat == CPU_OP:
            out.comm_ops.append((ts, end))
            out.ops.append((ts, end))
