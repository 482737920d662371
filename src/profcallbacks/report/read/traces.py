"""One pass over a Chrome trace: its captured steps, their breakdown, and operator self times.

Definitions (all durations in milliseconds, per ``ProfilerStep#N`` range):

- ``data_wait_ms``: time covered by dataloader ``__next__`` events inside the step;
- ``compute_ms``: time covered by outermost CPU operators (on any thread of the process), data
  wait excluded: the host was running framework work;
- ``other_ms``: the rest of the step: Python between operators, logging, waiting on locks;
- ``compiled_ms``: time covered by torch.compile's regions (``Torch-Compiled Region``,
  ``CompiledFunction``/``CompiledFunctionBackward``, ``## Call CompiledFxGraph``, dynamo's cache
  lookup), part of the above: how much of the step runs compiled code;
- ``gpu_kernel_ms``: time covered by GPU kernels and memcpy/memset inside the step (``None``
  for traces without device activity).

An operator's self time is its duration minus that of the CPU operators nested directly in it
on the same thread, as in ``torch.profiler``'s ``key_averages()``.
"""

from __future__ import annotations

import logging
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import lt
from pathlib import Path
from typing import Any

from profcallbacks.core.collector import gc_paused
from profcallbacks.core.trace_names import COMPILED_PREFIXES, CPU_OP, LOADER_PREFIXES, USER_ANNOTATION
from profcallbacks.core.trace_names import GPU_CATEGORIES as GPU_CATS
from profcallbacks.core.trace_names import STEP_PREFIX as _STEP_PREFIX
from profcallbacks.report.model.capture import Capture
from profcallbacks.report.model.intervals import Spans, covered, merge
from profcallbacks.report.read.capture_model import CaptureBuilder
from profcallbacks.report.read.decode import MISSING, Args, Event, Trace, decode_trace, slim
from profcallbacks.report.read.events import Scan, Scanner
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.files import as_int as _int
from profcallbacks.report.read.generations import Normaliser, TraceFormat, normalise
from profcallbacks.report.read.plain_operators import MAX_US as _MAX_US
from profcallbacks.report.read.plain_operators import PlainOperators
from profcallbacks.report.read.stream import stream_trace

log = logging.getLogger(__name__)
_WORKER_RANK = re.compile(r"^rank(\d{1,9})_")

Interval = tuple[float, float]
_Thread = tuple["array[float]", "array[float]", "array[int]"]  # a thread's CPU operators: ts, dur, name id


@dataclass
class TraceSummary:
    """What the report needs from one trace file (durations in ms)."""

    path: Path
    rank: int
    world_size: int
    worker: str
    trigger: str | None
    partial: bool
    export_overlap: bool = False  # recorded while an earlier capture was still being exported
    budget: dict[str, Any] | None = None  # what the capture byte budget predicted and trimmed
    steps: list[dict[str, Any]] = field(default_factory=list)
    cpu_ops: dict[str, list[float]] = field(default_factory=dict)  # name -> [calls, self, total]
    gpu_ops: dict[str, list[float]] = field(default_factory=dict)  # name -> [calls, total]
    bad_events: int = 0  # events skipped as malformed (not an object, ts/dur not numbers, ...)
    bad_example: str = ""  # why the first of them was skipped
    analysis: dict[str, Any] | None = None  # report/analyse/captures.py: GPU breakdown, host side, metrics
    format: TraceFormat = field(default_factory=TraceFormat)  # report/read/generations.py


@dataclass
class TraceModel:
    """One trace file read: what the analyses read of it, without its events.

    Attributes:
        summary: Steps, their breakdown and operator times (``TraceSummary``).
        scan: The GPU rows, step, loader, optimizer, collective and blocking-call ranges the GPU
            breakdown and host side read (``read/events.py``); ``None`` when the pass failed.
        capture: The capture model the diagnoses and throughput read (``model/capture.py``);
            ``None`` when it could not be built.
        failure: Why ``scan`` or ``capture`` is missing (``TypeError: ...``), else ``None``.
    """

    summary: TraceSummary
    scan: Scan | None
    capture: Capture | None
    failure: str | None = None


def read_trace_file(path: Path, readers: int = 1) -> TraceModel:
    """Reads one trace file into its ``TraceModel`` in one streamed pass: each decoded piece
    feeds the model and is let go, so no event outlives its piece. ``readers``: traces read at
    once, sharing the memory a trace may take (``read/stream.py``: ``event_limit``).

    Raises:
        ReadError: The file cannot be read or is not a Chrome trace.
    """
    with gc_paused():
        builder = ModelBuilder(path)
        blocks = stream_trace(path, take=builder.add, sift=builder.sift, readers=readers)
        return builder.finish(blocks)


def read_parsed_trace(trace: Any, path: Path) -> TraceModel:
    """The ``TraceModel`` of a trace already parsed into dicts (the export helper's).

    Raises:
        ReadError: ``trace`` is not a Chrome trace, or is malformed beyond reading.
    """
    return trace_model(slim(trace, path), path)


def read_trace_bytes(data: bytes | bytearray, path: Path) -> TraceModel:
    """The ``TraceModel`` of ``data``, a trace's JSON (the export helper's, before it is written).

    Raises:
        ReadError: ``data`` is not a Chrome trace, or is malformed beyond reading.
    """
    return trace_model(decode_trace(data, path), path)


def trace_model(trace: Trace, path: Path) -> TraceModel:
    """The ``TraceModel`` of a decoded trace (rewritten into the torch 2.x vocabulary in place).

    Raises:
        ReadError: The trace is malformed beyond reading (named, never a crash).
    """
    builder = ModelBuilder(path)
    builder.add(trace.traceEvents)
    return builder.finish(trace)


class ModelBuilder:
    """One trace's ``TraceModel`` built from its events piece by piece, in file order: each piece
    is normalised (``generations.Normaliser``), then summarised, scanned and added to the capture
    model. A fault in the summary is a named ``ReadError``; one in the scan or the capture model
    loses only that part (as ``TraceModel.failure`` / no diagnoses)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.normaliser = Normaliser()
        self.summariser = Summariser()
        scanner, capture = Scanner(), CaptureBuilder()
        self.scanner: Scanner | None = scanner
        self.capture: CaptureBuilder | None = capture
        self.plain: PlainOperators | None = PlainOperators(self.normaliser, self.summariser,
                                                           scanner, capture)
        self.failure: str | None = None

    def add(self, events: list[Any]) -> None:
        """Takes one piece of decoded events (``decode.Event``, or anything a hostile trace holds):
        the plain CPU operators in one walk for every part (``plain_operators.py``), the other
        events part by part.

        Raises:
            ReadError: The piece is malformed beyond reading.
        """
        if self.plain is not None:  # gone with the scan or the capture model, if either failed
            self.plain.add(events, self._add_each)
        else:
            self._add_each(events)

    def sift(self, piece: list[Any], keep: Callable[[list[Any]], list[Any]]) -> int:
        """Takes one piece as decoded (``stream.py``: ``Sift``): the plain CPU operators as
        :meth:`add` does, each run of other events through ``keep`` (the stream's filter)
        first; returns how many operators were plain.

        Raises:
            ReadError: The piece is malformed beyond reading.
        """
        if self.plain is None:
            self._add_each(keep(piece))
            return 0
        return self.plain.add(piece, lambda run: self._add_each(keep(run)), decoded=True)

    def _add_each(self, events: list[Any]) -> None:
        """Feeds ``events`` to each part in turn (the normaliser first: it rewrites categories)."""
        try:
            self.normaliser.add(events)
            self.summariser.add(events)
        except (ReadError, MemoryError):
            raise
        except Exception as exc:  # a malformed trace is a named problem, never a crash
            raise ReadError(self.path, f"malformed trace ({type(exc).__name__}: {exc})") from None
        if self.scanner is not None:
            try:
                self.scanner.add(events)
            except Exception as exc:  # the verdict is lost, the rest of the file is still reported
                self.scanner, self.failure = None, f"{type(exc).__name__}: {exc}"
                self.plain = None
        if self.capture is not None:
            try:
                self.capture.add(events)
            except Exception as exc:  # the diagnoses are lost, the rest stands
                self._no_capture(exc)

    def finish(self, trace: Trace) -> TraceModel:
        """The model of every piece added; ``trace`` gives the top-level blocks (metadata,
        distributed info, device properties), not its events.

        Raises:
            ReadError: The trace is malformed beyond reading.
        """
        try:
            found = self.normaliser.format(trace.deviceProperties)
            summary = self.summariser.finish(trace, self.path, found)
        except (ReadError, MemoryError):
            raise
        except Exception as exc:  # a malformed trace is a named problem, never a crash
            raise ReadError(self.path, f"malformed trace ({type(exc).__name__}: {exc})") from None
        capture = None
        if self.capture is not None:
            try:
                capture = self.capture.finish(trace.deviceProperties)
                capture.cpu_load = _block(_block(trace.profcallbacks).get("cpu")) or None
            except Exception as exc:  # the diagnoses are lost, the rest stands
                self._no_capture(exc)
        return TraceModel(summary, None if self.scanner is None else self.scanner.found,
                          capture, self.failure)

    def _no_capture(self, exc: Exception) -> None:
        log.warning("profcallbacks: no diagnoses for a trace (%s: %s)", type(exc).__name__, exc)
        self.capture = None
        self.plain = None


def summarise(trace: Trace, path: Path) -> TraceSummary:
    """Summarises a decoded Chrome trace (see the module docstring for the definitions).

    The trace is first rewritten into the torch 2.x vocabulary (report/read/generations.py), in place:
    the analyses that read it afterwards see the same categories.
    """
    found = normalise(trace)
    summariser = Summariser()
    summariser.add(trace.traceEvents)
    return summariser.finish(trace, path, found)


class Summariser:
    """:func:`summarise` fed piece by piece, after :class:`~.generations.Normaliser` saw each
    piece: per thread the CPU operators' starts, durations and names, GPU intervals, compiled
    regions and step ranges; no record per event."""

    def __init__(self) -> None:
        self.threads: dict[tuple[Any, Any], _Thread] = {}
        self.names: list[str] = []  # the CPU operators' names, by id
        self.name_ids: dict[str, int] = {}
        self.compiled_ids: set[int] = set()  # names of torch.compile's regions
        self.gpu: list[Interval] = []
        self.compiled: list[Interval] = []
        self.step_events: list[tuple[float, float, str, bool]] = []
        self.gpu_ops: dict[str, list[float]] = {}  # name -> [calls, total us]
        self.bad_events = 0
        self.bad_example = ""

    def add(self, events: list[Any]) -> None:
        """Takes what the summary reads from normalised ``events`` (decode.Event, or anything a
        hostile trace holds); malformed ones are counted."""
        threads, gpu, compiled, gpu_ops = self.threads, self.gpu, self.compiled, self.gpu_ops
        step_events, name_ids, compiled_ids = self.step_events, self.name_ids, self.compiled_ids
        last_pid: Any = MISSING  # the thread of the last operator: its key is not made again
        last_tid: Any = MISSING
        last_thread: Any = None
        for event in events:
            try:
                if event.ph != "X":
                    continue
                cat = event.cat
                if cat != CPU_OP and cat not in GPU_CATS and cat != USER_ANNOTATION:
                    continue
                ts, dur, name = event.ts, event.dur, event.name
                if ts is MISSING:
                    raise KeyError("ts")
                ts, dur = float(ts), 0.0 if dur is MISSING else float(dur)
                if not (-_MAX_US < ts < _MAX_US and 0.0 <= dur < _MAX_US):  # NaN fails too
                    raise ValueError(f"ts={event.ts!r}, dur={event.dur!r} out of range")
            except Exception as exc:  # not an object, no ts, ts "abc", dur null ...
                if not self.bad_events:
                    self.bad_example = (f"{type(exc).__name__}: {str(exc)[:80]}"
                                        if isinstance(event, Event) else
                                        f"{str(event)[:40]!r} is not a JSON object")
                self.bad_events += 1
                continue
            if type(name) is not str:
                name = "" if name is MISSING else str(name)
            if cat == CPU_OP:
                pid, tid = event.pid, event.tid
                if type(pid) is int and type(tid) is int and pid == last_pid and tid == last_tid:
                    thread = last_thread  # the same thread as the last operator: no key made
                else:
                    key = ((pid, tid) if type(pid) is int and type(tid) is int
                           else (_key(pid), _key(tid)))
                    thread = threads.get(key)
                    if thread is None:
                        thread = threads[key] = (array("d"), array("d"), array("i"))
                    last_pid, last_tid, last_thread = pid, tid, thread
                n = name_ids.get(name)
                if n is None:
                    n = name_ids[name] = len(self.names)
                    self.names.append(name)
                    if name.startswith(COMPILED_PREFIXES):
                        compiled_ids.add(n)
                if n in compiled_ids:
                    compiled.append((ts, ts + dur))
                thread[0].append(ts)
                thread[1].append(dur)
                thread[2].append(n)
            elif cat in GPU_CATS:
                gpu.append((ts, ts + dur))
                row = gpu_ops.get(name)
                if row is None:
                    gpu_ops[name] = [1, dur]
                else:
                    row[0] += 1
                    row[1] += dur
            elif name.startswith(_STEP_PREFIX):
                args = event.args
                ours = isinstance(args, Args) and bool(args.profcallbacks)
                step_events.append((ts, dur, name, ours))
            elif name.startswith(COMPILED_PREFIXES):
                compiled.append((ts, ts + dur))

    def finish(self, trace: Trace, path: Path, found: TraceFormat) -> TraceSummary:
        """The summary of every piece added; ``trace`` gives the top-level blocks (its events
        are not read)."""
        meta = _block(trace.profcallbacks)
        dist = _block(trace.distributedInfo)
        worker = path.name.split(".")[0]
        match = _WORKER_RANK.match(worker)
        rank = _int(meta.get("rank", dist.get("rank")), int(match.group(1)) if match else 0)
        trigger = meta.get("trigger")
        summary = TraceSummary(path=path, rank=rank, world_size=_int(dist.get("world_size"), 1),
                               worker=worker, trigger=trigger if isinstance(trigger, str) else None,
                               partial=bool(meta.get("partial")),
                               export_overlap=meta.get("export_overlap") is True, format=found,
                               budget=meta.get("budget") if isinstance(meta.get("budget"), dict)
                               else None, gpu_ops=self.gpu_ops, bad_events=self.bad_events,
                               bad_example=self.bad_example)
        compute, data = _self_times(self.threads, self.names, summary.cpu_ops)
        self.threads = {}
        data_merged = merge(data)
        compute_merged = compute.minus(data_merged)
        del compute
        gpu_merged = merge(self.gpu) if self.gpu else None
        compiled_merged = merge(self.compiled) if self.compiled else None
        step_events = self.step_events
        if any(ours for *_, ours in step_events):  # prefer our exact step ranges over the profiler's
            step_events = [e for e in step_events if e[3]]
        for ts, dur, name, _ in sorted(step_events):
            end = ts + dur
            data_us = covered(data_merged, ts, end)
            compute_us = compute_merged.covered(ts, end)
            summary.steps.append({
                "step": _step_number(name),
                "step_ms": dur / 1e3,
                "data_wait_ms": data_us / 1e3,
                "compute_ms": compute_us / 1e3,
                "other_ms": max(dur - data_us - compute_us, 0.0) / 1e3,
                "gpu_kernel_ms": None if gpu_merged is None else covered(gpu_merged, ts, end) / 1e3,
                "compiled_ms": (0.0 if compiled_merged is None
                                else covered(compiled_merged, ts, end) / 1e3),
            })
        for row in summary.cpu_ops.values():
            row[1] /= 1e3
            row[2] /= 1e3
        for row in summary.gpu_ops.values():
            row[1] /= 1e3
        return summary


def _self_times(threads: dict[Any, _Thread], names: list[str],
                ops: dict[str, list[float]]) -> tuple[Spans, list[Interval]]:
    """Fills ``ops`` with calls and self/total times (us), names in the order first visited;
    returns the union of outermost operators and the dataloader intervals.

    Each thread's operators are visited by start, the longest first among equal starts (two
    stable sorts of their indices, none where they were read in that order: no record per
    operator, and the outermost ones joined as they come); an operator's times are added to its
    name's when it closes."""
    runs: list[Spans] = []
    data: list[Interval] = []
    calls, selfs, totals = [0] * len(names), [0.0] * len(names), [0.0] * len(names)
    first: dict[int, None] = {}  # name ids, in the order first visited
    loader = {n for n, name in enumerate(names) if name.startswith(LOADER_PREFIXES)}
    for starts, durs, name_ids in threads.values():
        order: Sequence[int]
        if all(map(lt, starts, islice(starts, 1, None))):  # read in order, no two at one start
            order = range(len(starts))  # no list of indices (~40 bytes per operator)
            first.update(dict.fromkeys(name_ids))
        else:
            order = sorted(range(len(starts)), key=durs.__getitem__, reverse=True)
            order.sort(key=starts.__getitem__)
            first.update(dict.fromkeys(map(name_ids.__getitem__, order)))
        stack: list[list[Any]] = []  # [end, row, children's time] of open ancestors
        outer = Spans()
        runs.append(outer)
        for i in order:
            ts = starts[i]
            dur = durs[i]
            while stack and stack[-1][0] <= ts:
                _, j, inner = stack.pop()
                n, d = name_ids[j], durs[j]
                calls[n] += 1
                selfs[n] += d - inner
                totals[n] += d
            if stack:
                stack[-1][2] += dur
            elif name_ids[i] in loader:
                data.append((ts, ts + dur))
            else:
                outer.add(ts, ts + dur)
            stack.append([ts + dur, i, 0.0])
        for _, j, inner in reversed(stack):
            n, d = name_ids[j], durs[j]
            calls[n] += 1
            selfs[n] += d - inner
            totals[n] += d
    for n in first:
        ops[names[n]] = [calls[n], selfs[n], totals[n]]
    return (runs[0] if len(runs) == 1 else Spans.union(runs)), data


def _block(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _step_number(name: str) -> int:
    digits = name[len(_STEP_PREFIX):]
    if not digits.isascii() or not digits.isdigit() or len(digits) > 18:  # e.g. 10**400
        return -1
    return int(digits)


def _key(value: Any) -> Any:
    """A pid or tid usable as a dict key (a list or object from a hostile trace is not)."""
    if value is MISSING:  # as for null
        value = None
    return value if isinstance(value, (int, str)) else str(value)


def _disk_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the reader names the error
