"""Builds the ``Capture`` the rules read from one decoded trace.

One pass sorts the events into CPU operators (and annotations), CUDA runtime calls, GPU activity
and Python frames; a sweep per thread then gives each operator the names of those enclosing it
and each kernel the operators enclosing its launch (via the launch's ``correlation`` id), so a
rule can tell a matmul's kernel from a convolution's, or an optimizer's from the model's.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Sequence
from itertools import chain, islice
from operator import attrgetter, lt
from typing import Any

from profcallbacks.core.trace_names import (
    CPU_OP,
    CUDA_PROFILER_RANGE,
    KERNEL,
    OLD_CATEGORIES,
    PYTHON_FUNCTION,
    USER_ANNOTATION,
)
from profcallbacks.core.trace_names import GPU_CATEGORIES as _GPU_CATS
from profcallbacks.core.trace_names import HOST_ONLY_CATEGORIES as HOST_ONLY_CATS
from profcallbacks.core.trace_names import RUNTIME_CATEGORIES as _RUNTIME_CATS
from profcallbacks.core.trace_names import STEP_PREFIX as _STEP
from profcallbacks.report.model.capture import Capture, Device, Kernel, Op, OpTable
from profcallbacks.report.model.flops import COUNTED, shape_flops
from profcallbacks.report.read.decode import MISSING, Args, shape_value

_HOST_CATS = frozenset({CPU_OP, USER_ANNOTATION})
_ARCH = (("hopper", 9, 0), ("sm90", 9, 0), ("ampere", 8, 0), ("sm80", 8, 0), ("sm86", 8, 6),
         ("turing", 7, 5), ("sm75", 7, 5), ("volta", 7, 0), ("sm70", 7, 0))
_ARCH_RE = re.compile(r"(?:^|[^a-z])(hopper|ampere|turing|volta|sm90|sm80|sm86|sm75|sm70)_")


def device_of(properties: Any, kernel_names: list[str]) -> Device | None:
    """The trace's GPU from ``deviceProperties`` (the first entry), else guessed from kernel names."""
    if isinstance(properties, list) and properties and isinstance(properties[0], dict):
        first = properties[0]
        major, minor = first.get("computeMajor"), first.get("computeMinor")
        if isinstance(major, int) and isinstance(minor, int):
            name = first.get("name") if isinstance(first.get("name"), str) else None
            amd = name is not None and re.search(r"AMD|Radeon|Instinct|\bMI\d{3}", name) is not None
            return Device(name, major, minor, nvidia=not amd)
    for name in kernel_names:
        match = _ARCH_RE.search(name)
        if match:
            arch = match.group(1)
            major, minor = next((ma, mi) for a, ma, mi in _ARCH if a == arch)
            return Device(None, major, minor, guessed=True)
    return None


def build_capture(events: list[Any], properties: Any = None) -> Capture:
    """The ``Capture`` of decoded ``events`` (``decode.Event``); malformed events are skipped."""
    builder = CaptureBuilder()
    builder.add(events)
    return builder.finish(properties)


class CaptureBuilder:
    """:func:`build_capture` fed piece by piece (a streamed trace's pieces, in file order)."""

    def __init__(self) -> None:
        self.ops = OpTable()
        self.runtime: list[Op] = []
        self.frames: dict[Any, list[Op]] = {}
        self.kernels: list[Kernel] = []
        self.launch_of: dict[int, Op] = {}
        self.corr_of: dict[int, int] = {}  # id(kernel) -> correlation
        self.steps: list[tuple[float, float, str, bool]] = []
        self.cats: set[Any] = set()
        self.flops: list[tuple[float, float]] = []
        self.shaped: list[tuple[int, Any]] = []  # row in ops, its args
        self.thread_keys: dict[tuple[Any, Any], tuple[Any, Any]] = {}  # one key object per thread

    def add(self, events: list[Any]) -> None:
        """Takes the operators, runtime calls, GPU activity and frames of ``events``."""
        ops, runtime, frames, kernels = self.ops, self.runtime, self.frames, self.kernels
        launch_of, corr_of, steps, cats = self.launch_of, self.corr_of, self.steps, self.cats
        flops, shaped, thread_keys = self.flops, self.shaped, self.thread_keys
        put_ts, put_end, put_name, put_tid = ops.ts.append, ops.end.append, ops.name.append, ops.tid.append
        name_ids = ops._name_ids
        last_tid: Any = None  # the thread of the last operator, and its id in ops
        last_id = -1
        last_pid: Any = MISSING  # the pid and tid of the last event, and their thread key
        last_raw: Any = MISSING
        last_key: Any = None
        for event in events:
            try:
                if event.ph != "X":
                    continue
                cat, name, ts, dur = event.cat, event.name, event.ts, event.dur
                if cat in OLD_CATEGORIES:  # a trace not normalised by the reader yet
                    cat = OLD_CATEGORIES[cat]
                if cat is MISSING or name is MISSING or type(ts) is str or type(dur) is str:
                    continue
                if not (math.isfinite(ts) and dur >= 0):
                    continue
            except (AttributeError, TypeError):
                continue
            name = name if type(name) is str else str(name)
            end = ts + dur
            args = event.args if isinstance(event.args, Args) else None
            pid, raw_tid = event.pid, event.tid
            if type(pid) is int and type(raw_tid) is int and pid == last_pid and raw_tid == last_raw:
                tid = last_key  # the same thread as the last event: no key made
            else:
                tid = (pid, raw_tid)
                try:
                    tid = thread_keys.setdefault(tid, tid)
                except TypeError:  # a pid or tid a hostile trace made a list: kept as it is
                    pass
                last_pid, last_raw, last_key = pid, raw_tid, tid
            if cat in _HOST_CATS:
                n = name_ids.get(name)  # a name in the table is no step's
                if n is None and name.startswith(_STEP):
                    steps.append((ts, end, name, bool(args is not None and args.profcallbacks)))
                    continue
                if n is None or tid is not last_tid:  # a new name or thread: the table's way
                    ops.append(ts, end, name, tid)
                    last_tid, last_id = tid, ops.tid[-1]
                else:
                    put_ts(ts)
                    put_end(end)
                    put_name(n)
                    put_tid(last_id)
                if args is not None and isinstance(args.flops, (int, float)) and args.flops > 0:
                    flops.append((ts, float(args.flops)))
                elif args is not None and name in COUNTED:
                    shaped.append((len(ops) - 1, args))
            elif cat == PYTHON_FUNCTION:
                frames.setdefault(tid, []).append(Op(ts, end, name, tid))
            elif cat in _RUNTIME_CATS:
                call = Op(ts, end, name, tid)
                runtime.append(call)
                corr = _int(args.correlation) if args is not None else -1
                if corr >= 0:
                    launch_of[corr] = call
            elif cat in _GPU_CATS:
                kernel = Kernel(ts, end, name, cat)
                kernels.append(kernel)
                corr = _int(args.correlation) if args is not None else -1
                if corr >= 0:
                    corr_of[id(kernel)] = corr
            elif type(cat) is str:
                cats.add(cat)  # another device's activity (mtia_runtime ...) or a host category

    def finish(self, properties: Any = None) -> Capture:
        """The capture of every piece added (``properties``: the trace's ``deviceProperties``)."""
        ops, runtime, kernels, steps, flops = self.ops, self.runtime, self.kernels, self.steps, self.flops
        _nest(ops, runtime)
        source = "with_flops" if flops else None
        if not flops:
            for row, args in self.shaped:
                if any(p in COUNTED for p in ops.chains[ops.parent[row]]):
                    continue  # counted once, at the outermost counted operator
                value = shape_flops(ops.names[ops.name[row]], shape_value(args.dims),
                                    shape_value(args.concrete))
                if value:
                    flops.append((ops.ts[row], value))
            source = "shapes" if flops else None
        self.shaped = []
        launch_of, corr_of = self.launch_of, self.corr_of
        for kernel in kernels:
            found = launch_of.get(corr_of.get(id(kernel), -1))
            if found is not None:
                call = found
                kernel.launch_ts = call.ts
                kernel.ops = call.parents
        kernels.sort(key=lambda k: k.ts)
        if any(ours for *_, ours in steps):
            steps = [s for s in steps if s[3]]
        ranges = [(s, e, _number(n)) for s, e, n, _ in steps]
        whole = False
        if not ranges and (ops or runtime):
            ranges = [(min(chain(ops.ts, (o.ts for o in runtime))),
                       max(chain(ops.end, (o.end for o in runtime))), -1)]
            whole = True
        for items in self.frames.values():
            items.sort(key=lambda f: (f.ts, -f.end))
        cats = self.cats
        return Capture(steps=ranges, ops=ops, runtime=runtime, kernels=kernels, frames=self.frames,
                       device=device_of(properties, [k.name for k in kernels if k.cat == KERNEL][:2000]),
                       flops=flops, flops_source=source, whole_span=whole,
                       cpu_only=not kernels and not runtime and cats <= HOST_ONLY_CATS,
                       replayed=CUDA_PROFILER_RANGE in cats)


def _nest(ops: OpTable, runtime: list[Op]) -> None:
    """Sets the parents of every operator (``ops.parent``) and runtime call (``parents``): the
    operators enclosing it on its thread, outermost first.

    Each thread's items are visited by start, operators before runtime calls, the longest
    first, then in the order read (stable sorts; no sort and no list of rows where a thread's
    operators were read in start order, as in most traces)."""
    threads: dict[Any, tuple[Sequence[int], list[Op]]] = {}  # by the table's thread id
    ops.unnested()
    ts, tid_col = ops.ts, ops.tid
    if len(ops.tids) == 1:
        threads[0] = (range(len(ts)), [])
    else:
        rows_of = [array("l") for _ in ops.tids]
        for i, t in enumerate(tid_col):
            rows_of[t].append(i)
        for t, thread_rows in enumerate(rows_of):
            threads[t] = (thread_rows, [])
    tid_ids = ops.tid_ids
    for item in runtime:
        thread: Any
        try:  # a thread without operators is keyed by itself
            thread = tid_ids.get(item.tid, ("no operators", item.tid))
        except TypeError:  # a pid or tid a hostile trace made a list: a thread of its own
            thread = ("unhashable", id(item))
        threads.setdefault(thread, (range(0), []))[1].append(item)
    chain_ids: dict[tuple[int, int], int] = {}  # (parents' chain, name) -> chain
    chains, parent, end_col, name_col = ops.chains, ops.parent, ops.end, ops.name
    names = ops.names
    for rows, calls in threads.values():
        starts = ts if isinstance(rows, range) else array("d", map(ts.__getitem__, rows))
        order: Sequence[int] = rows
        if not all(map(lt, starts, islice(starts, 1, None))):  # not read in start order
            order = sorted(rows, key=end_col.__getitem__, reverse=True)
            order.sort(key=ts.__getitem__)
        calls.sort(key=_END, reverse=True)
        calls.sort(key=_START)
        stack: list[tuple[float, int]] = []  # (end, chain of its parents) of open operators
        cur = 0
        k, n_calls = 0, len(calls)
        for row in order:
            start = ts[row]
            while k < n_calls and calls[k].ts < start:  # the calls before this operator
                call = calls[k]
                while stack and stack[-1][0] <= call.ts:
                    cur = stack.pop()[1]
                call.parents = chains[cur]
                k += 1
            while stack and stack[-1][0] <= start:
                cur = stack.pop()[1]
            parent[row] = cur
            stack.append((end_col[row], cur))
            key = (cur, name_col[row])
            found = chain_ids.get(key)
            if found is None:  # one tuple per distinct chain of names, shared by its rows
                found = chain_ids[key] = len(chains)
                chains.append((*chains[cur], names[name_col[row]]))
            cur = found
        for call in calls[k:]:
            while stack and stack[-1][0] <= call.ts:
                cur = stack.pop()[1]
            call.parents = chains[cur]


_START = attrgetter("ts")
_END = attrgetter("end")


def enclosing_frame(frames: list[Op], ts: float, skip: tuple[str, ...]) -> str | None:
    """The innermost Python frame around ``ts`` whose name holds none of ``skip``
    (``file.py(12): fn``), or None."""
    best: Op | None = None
    for frame in frames:
        if frame.ts > ts:
            break
        if frame.end >= ts and not any(s in frame.name for s in skip):
            best = frame if best is None or frame.ts >= best.ts else best
    return best.name if best is not None else None


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return -1


def _number(name: str) -> int:
    digits = name[len(_STEP):]
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) < 18 else -1
