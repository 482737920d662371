"""The critical path of the captured steps: what the step's length waits on, host or GPU.

The step model joins the host threads and the GPU by the edges HTA's critical-path analysis uses:
a kernel starts after its launch (the runtime call's start) and after the work before it on the
GPU; a blocking call (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, a device-to-host
copy, HIP's equivalents) returns after the GPU work it waits for. Walking back from the end of
the last step, each moment is charged to the dependency that arrived last:

- on the GPU at ``t``: the kernel (or copy, memset) running until ``t`` is ``gpu`` time; before
  it, if its launch came after the GPU had finished the work before it (the host was late), the
  path goes to the host at the launch (the time between the launch and the kernel's start is
  ``launch``), else it stays on the GPU (gaps between back-to-back kernels are the GPU's);
- on the host at ``t``: the host's own time back to the last blocking call that really waited
  (a copy call: its own copy ended while it was blocked; a sync: the GPU finished its last work
  within ``WAIT_SLACK_US`` of the call's return, or later) is ``host`` time (``data`` where the
  training thread waits for the data loader, ``between`` where no operator runs: Python and
  framework code, which HTA's path leaves out); there the path goes to the GPU. A blocking
  call that returned long after the GPU went idle did not wait: it stays host time.

The walk starts at the later of the last step's host end and the end of the GPU work launched in
the steps, and stops at the first step's start (without steps: the whole host span). The host's
parts are charged to the step they fall in, the GPU's (and a late launch) to the step that
launched the kernel, as HTA's per-step path holds its step's kernels; the cold part of the
capture (``Capture.cold``) is left out. Checked against HTA 0.5.0 per step
(``tests/test_critical_path.py``, ``docs/explanation/calibration.md``). A fix shortens the
step only as much as its side holds of the path: a host-side fix (fewer operators, a fused
optimizer, loader workers) by at most the host's part, a GPU-side fix (TF32, fused attention)
by at most the GPU's. With one GPU the walk treats all streams as one (the trace's kernels carry
no stream in the capture model).

Example:
    >>> from profcallbacks.report.model.capture import Capture, Kernel, Op
    >>> cap = Capture(steps=[(0.0, 100.0, 1)], ops=[], device=None, frames={},
    ...               runtime=[Op(10.0, 12.0, "cudaLaunchKernel", 1)],
    ...               kernels=[Kernel(15.0, 115.0, "sgemm", "kernel", launch_ts=10.0)])
    >>> p = critical_path(cap)
    >>> p.gpu_ms, p.launch_ms, p.host_ms
    (0.1, 0.005, 0.01)
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from profcallbacks.core.trace_names import (
    ASYNC_COPY_CALLS,
    BLOCKING_COPY_CALLS,
    GPU_MEMCPY,
    LOADER_PREFIXES,
)
from profcallbacks.report.model.capture import Capture, Kernel, Op
from profcallbacks.report.model.intervals import Interval, covered, merge

WAIT_SLACK_US = 20.0
"""A blocking call waited on the GPU when the GPU's work ended at most this long before it
returned (the return itself takes a few microseconds)."""
BACK_TO_BACK_US = 1.0
"""A kernel whose launch came later than this after the GPU finished the work before it was
held back by the host."""
LAUNCH_LATENCY_US = 200.0
"""The longest a kernel takes to start after its launch on an idle GPU; one that started later
waited on other GPU work (another stream, an event), not on the host."""
PARTS = ("gpu", "launch", "host", "between", "data")
"""Parts of each step's row: ``host`` is the host inside operators, ``between`` the host between
operators (Python, framework code: HTA's path leaves it out); ``host_ms`` holds both."""
Segment = tuple[float, float, str, float | None]
"""``(from, to, part, launch)``: a stretch of the path; ``launch`` is the launch time of the
kernel a GPU-side stretch belongs to (it counts for the step that launched it), else ``None``."""


@dataclass
class CriticalPath:
    """The critical path's parts per steady step (ms); ``per_step``: each step's parts."""

    gpu_ms: float = 0.0
    launch_ms: float = 0.0
    host_ms: float = 0.0
    data_ms: float = 0.0
    steps: int = 0
    per_step: list[dict[str, float]] = field(default_factory=list)
    step_numbers: list[int] = field(default_factory=list)  # each ``per_step`` row's step

    @property
    def length_ms(self) -> float:
        return self.gpu_ms + self.launch_ms + self.host_ms + self.data_ms

    @property
    def gpu_share(self) -> float:
        """The GPU's part of the path (its kernels, copies and the gaps between them)."""
        return self.gpu_ms / self.length_ms if self.length_ms > 0 else 0.0

    @property
    def host_share(self) -> float:
        """The host's part: its own time, the data wait and the launches it was late with."""
        return 1.0 - self.gpu_share if self.length_ms > 0 else 0.0

    @property
    def host_share_median(self) -> float:
        """The host's part of the median step's path: one odd step (the profiler's first active
        step, a checkpoint) does not decide the reading."""
        shares = [1.0 - r["gpu"] / sum(r.values()) for r in self.per_step if sum(r.values()) > 0]
        return statistics.median(shares) if shares else self.host_share

    def bound(self) -> str:
        """``"gpu"`` or ``"host"``: the side holding most of the median step's path."""
        return "gpu" if self.host_share_median <= 0.5 else "host"

    def sentence(self) -> str:
        """The path in words: what would shorten the step (``describe``)."""
        return describe(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"length_ms": round(self.length_ms, 4), "gpu_ms": round(self.gpu_ms, 4),
                "launch_ms": round(self.launch_ms, 4), "host_ms": round(self.host_ms, 4),
                "data_ms": round(self.data_ms, 4), "gpu_share": round(self.gpu_share, 4),
                "host_share": round(self.host_share, 4),
                "host_share_median": round(self.host_share_median, 4), "bound": self.bound(),
                "steps": self.steps}


def describe(path: Mapping[str, Any]) -> str:
    """A path (``CriticalPath.to_dict()``, or several pooled) in words: its parts per step and
    the side a fix must shorten.

    Example:
        >>> describe({"length_ms": 10.0, "gpu_ms": 8.0, "launch_ms": 0.5, "host_ms": 1.5,
        ...           "data_ms": 0.0, "bound": "gpu"}).split(": ")[1:]
        ['GPU 80%, host 20% (late launches 5%), data wait 0%', "shortening the GPU's work shortens the step"]
    """
    n = path["length_ms"] or 1.0
    side = "the GPU's work" if path["bound"] == "gpu" else "the host's work"
    return (f"critical path {path['length_ms']:.2f} ms per step: GPU {path['gpu_ms'] / n:.0%}, "
            f"host {(path['host_ms'] + path['launch_ms']) / n:.0%} (late launches "
            f"{path['launch_ms'] / n:.0%}), data wait {path['data_ms'] / n:.0%}: shortening "
            f"{side} shortens the step")


def blocking_calls(cap: Capture) -> list[Op]:
    """The host calls that return only after GPU work: syncs, blocking copies, and asynchronous
    copies to the host (they block for pageable memory)."""
    to_host = {k.launch_ts for k in cap.kernels if k.cat == GPU_MEMCPY and "DtoH" in k.name}
    return sorted((c for c in cap.runtime if "Synchronize" in c.name or c.name in BLOCKING_COPY_CALLS
                   or (c.name in ASYNC_COPY_CALLS and c.ts in to_host)), key=lambda c: c.end)


def critical_path(cap: Capture) -> CriticalPath | None:
    """The critical path of ``cap``'s steps (see the module docstring); ``None`` without GPU
    kernels or steps (a CPU run's path is its host thread)."""
    if not cap.has_gpu or not cap.steps:
        return None
    start, host_end = cap.steps[0][0], cap.steps[-1][1]
    kernels = sorted((k for k in cap.kernels if k.end > max(k.ts, start)), key=lambda k: k.end)
    launched = [k.end for k in kernels if (k.launch_ts if k.launch_ts is not None else k.ts)
                <= host_end]
    if not launched:
        return None
    walk = _Walk(cap, kernels)
    segments = walk.run(start, max(host_end, max(launched)))
    return _per_step(cap, segments)


class _Walk:
    """The backward walk over one capture's host and GPU timelines."""

    def __init__(self, cap: Capture, kernels: list[Kernel]) -> None:
        self.kernels = kernels
        self.ends = [k.end for k in kernels]
        self.busy = merge((k.ts, k.end) for k in kernels)
        self.busy_starts = [s for s, _ in self.busy]
        self.waits = blocking_calls(cap)
        self.wait_ends = [c.end for c in self.waits]
        # a copy call's own copy on the GPU (same launch time): the call returns after it, however
        # long the host then takes to move the data on (pageable memory), as HTA's edge has it
        self.own_copy = {k.launch_ts: k for k in kernels
                         if k.cat == GPU_MEMCPY and k.launch_ts is not None}
        ops = cap.ops
        self.data = merge(ops.spans_named(lambda n: n.startswith(LOADER_PREFIXES)))
        self.ops = merge(ops.spans_named(lambda n: not n.startswith(LOADER_PREFIXES)))

    def run(self, start: float, end: float) -> list[Segment]:
        """Segments covering ``[start, end]``, walked back from ``end``."""
        out: list[Segment] = []
        t, on_gpu = end, self._gpu_at(end) is not None
        guard = 4 * (len(self.kernels) + len(self.waits)) + 8
        while t > start and guard > 0:
            guard -= 1
            t, on_gpu = self._gpu_step(t, start, out) if on_gpu else self._host_step(t, start, out)
        return out

    def _gpu_at(self, t: float) -> Kernel | None:
        """The kernel ending last at or before ``t`` that was still running just before ``t``."""
        i = bisect.bisect_right(self.ends, t) - 1
        if i >= 0 and self.ends[i] >= t - BACK_TO_BACK_US:
            return self.kernels[i]
        j = bisect.bisect_right(self.busy_starts, t) - 1  # a kernel running through t
        if j >= 0 and self.busy[j][1] > t:
            after = itertools.islice(self.kernels, bisect.bisect_right(self.ends, t), None)
            running = [k for k in itertools.islice(after, 64) if k.ts < t]
            return min(running, key=lambda k: k.ts) if running else None
        return None

    def _gpu_step(self, t: float, start: float, out: list[Segment]) -> tuple[float, bool]:
        k = self._gpu_at(t)
        if k is None:
            return t, False
        begin = max(k.ts, start)
        owner = k.launch_ts
        out.append((begin, t, "gpu", owner))
        if begin <= start:
            return start, False
        prev = bisect.bisect_right(self.ends, min(k.ts + BACK_TO_BACK_US, t)) - 1
        prev_end = next((min(self.ends[i], begin) for i in range(prev, max(prev - 64, -1), -1)
                         if self.kernels[i] is not k), None)
        if k.launch_ts is not None and (prev_end is None or k.launch_ts > prev_end):
            launch = max(k.launch_ts, start)  # the host launched it after the GPU ran dry
            if begin - launch <= LAUNCH_LATENCY_US:
                out.append((launch, begin, "launch", owner))
                return launch, False
            # queued far longer than a launch takes: it waited on the GPU's side (another
            # stream's event, the device), not on the host
            resume = launch if prev_end is None else max(prev_end, launch)
            out.append((resume, begin, "gpu", owner))
            return resume, prev_end is not None and prev_end >= launch
        if prev_end is None:
            return begin, False
        if prev_end < begin:  # a gap the GPU sat idle with the kernel already queued
            out.append((max(prev_end, start), begin, "gpu", owner))
        return max(prev_end, start), True

    def _host_step(self, t: float, start: float, out: list[Segment]) -> tuple[float, bool]:
        i = bisect.bisect_right(self.wait_ends, t) - 1
        while i >= 0 and self.waits[i].end > start:
            call = self.waits[i]
            own = self.own_copy.get(call.ts) if "Synchronize" not in call.name else None
            if own is not None and call.ts < own.end <= call.end + WAIT_SLACK_US:
                k: Kernel | None = own
            else:
                j = bisect.bisect_right(self.ends, call.end + WAIT_SLACK_US) - 1
                k = self.kernels[j] if j >= 0 else None
            if k is not None and (k is own or k.end >= call.end - WAIT_SLACK_US) and k.end > call.ts:
                done = min(k.end, call.end, t)  # the call waited: the GPU's work comes before
                self._host(done, t, out)
                return done, True
            i -= 1
        self._host(start, t, out)
        return start, False

    def _host(self, begin: float, end: float, out: list[Segment]) -> None:
        """Host time ``[begin, end]``: its data-loader wait, the time inside operators and the
        time between them, each apart (their amounts; the stretch is not split in time)."""
        if end <= begin:
            return
        data = covered(self.data, begin, end)
        inside = min(covered(self.ops, begin, end), end - begin - data)
        between = end - begin - data - inside
        if data > 0:
            out.append((begin, begin + data, "data", None))
        if between > 0:
            out.append((begin + data, begin + data + between, "between", None))
        out.append((begin + data + between, end, "host", None))


def _per_step(cap: Capture, segments: list[Segment]) -> CriticalPath:
    """Segments charged to the steady steps: the GPU's work (and the late launch before it) to
    the step that launched it, as HTA's per-step path holds the kernels its step launched (a GPU
    that lags the host runs step N's kernels in step N+1's time); the host's time to the step
    it falls in (past the last step: the last)."""
    bounds = [(s, e) for s, e, _ in cap.steps]
    bounds[-1] = (bounds[-1][0], max(bounds[-1][1], max((seg[1] for seg in segments),
                                                        default=0.0)))
    starts = [s for s, _ in bounds]
    cold: list[Interval] = merge(cap.cold)
    charged: list[list[Segment]] = [[] for _ in bounds]
    for seg in segments:
        if seg[3] is not None:  # GPU work: the step that launched it
            i = min(max(bisect.bisect_right(starts, seg[3]) - 1, 0), len(bounds) - 1)
            charged[i].append(seg)
            continue
        for i, (s, e) in enumerate(bounds):
            if min(seg[1], e) > max(seg[0], s):
                charged[i].append((max(seg[0], s), min(seg[1], e), seg[2], None))
    rows: list[dict[str, float]] = []
    numbers: list[int] = []
    for (s, e), (_, _, number), mine in zip(bounds, cap.steps, charged, strict=True):
        if cold and covered(cold, s, e) > (e - s) / 2:
            continue  # a cold step (start-up, compilation) is not the steady state
        numbers.append(number)
        row = dict.fromkeys(PARTS, 0.0)
        for a, b, part, _ in mine:
            if b > a:
                row[part] += (b - a - (covered(cold, a, b) if cold else 0.0)) / 1e3
        rows.append(row)
    n = len(rows)
    path = CriticalPath(steps=n, per_step=[{k: round(v, 4) for k, v in r.items()} for r in rows],
                        step_numbers=numbers)
    if n:
        path.gpu_ms = sum(r["gpu"] for r in rows) / n
        path.launch_ms = sum(r["launch"] for r in rows) / n
        path.host_ms = sum(r["host"] + r["between"] for r in rows) / n
        path.data_ms = sum(r["data"] for r in rows) / n
    return path
