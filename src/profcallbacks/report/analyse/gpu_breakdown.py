"""GPU time breakdown of one trace, with the definitions of HTA 0.5.0 (Holistic Trace Analysis).

Over a rank's GPU timeline, from the start of its first GPU activity to the end of its last
(``span``):

- ``idle_share``: no kernel, memcpy or memset running on any stream;
- ``compute_share``: a compute kernel running (not NCCL, not memcpy/memset, no ``Sync`` in the
  name);
- ``non_compute_share``: only communication, memcpy or memset running;
- ``comm_overlap_share``: share of communication-kernel time during which a compute kernel runs
  too (``None`` without communication kernels).

Like HTA, GPU events are those with a ``stream`` and a ``correlation`` (plus ``Event Sync`` and
``Context Sync``); with two or more ``ProfilerStep#`` ranges, only the work launched before the
last one starts counts (it is usually cut short); nanosecond-resolution traces (float ``ts``) are
rounded inward to whole microseconds. That way the shares agree with HTA's on the same file.

The idle gaps between kernels (summed over streams) are split as HTA's
``get_idle_time_breakdown`` does: ``host_wait`` (the kernel was launched only after the
previous one on its stream ended: the host was late), ``kernel_wait`` (a gap under 30 us
between back-to-back kernels: launch overhead) and ``other``.
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
from functools import lru_cache
from typing import Any

from profcallbacks.core.trace_names import COPY_NAME_PREFIX
from profcallbacks.report.model.intervals import merge
from profcallbacks.report.read.events import Row, Scan

_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
KERNEL_WAIT_US = 30.0
"""Gaps between consecutive kernels on a stream shorter than this are launch overhead (HTA's
``consecutive_kernel_delay``)."""
SHORT_KERNEL_US = 10.0
"""Kernels shorter than this do too little work to hide their own launch cost (~5-10 us)."""



@lru_cache(maxsize=1 << 13)  # a trace has a few hundred kernel names, each row looks one up
def kernel_type(name: str) -> str:
    """``communication``, ``memory``, ``compute`` or ``other``, as HTA classifies kernel names.

    Example:
        >>> [kernel_type(n) for n in ("ncclKernel_AllReduce", "Memcpy HtoD", "volta_sgemm", "Sync")]
        ['communication', 'memory', 'compute', 'other']
    """
    if _COMM.match(name):
        return "communication"
    if _MEMORY.match(name):
        return "memory"
    if not _NOT_COMPUTE.match(name):
        return "compute"
    return "other"


def total(merged: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merged)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length covered by both merged interval lists."""
    i = j = 0
    out = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(merged: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The parts of sorted, disjoint ``merged`` intervals inside ``[start, end]``."""
    i = max(bisect.bisect_right(merged, (start, math.inf)) - 1, 0)
    out = []
    while i < len(merged) and merged[i][0] < end:
        s, e = merged[i]
        if e > start:
            out.append((max(s, start), min(e, end)))
        i += 1
    return out


def gpu_rows(found: Scan, problems: list[str]) -> tuple[list[Row], dict[int, float]]:
    """The GPU activity HTA would count, and the host launch time (us) of each correlation id.

    Events with a missing, non-numeric or negative ``dur`` were skipped by the scan; they are
    counted in ``problems`` (one sentence per kind of fault).
    """
    gpu, host = found.gpu, found.host
    if found.bad_dur:
        problems.append(f"skipped {found.bad_dur} event(s) with a missing or negative duration "
                        "(or no ts or name)")
    launches = {corr: ts for ts, corr, _ in host if corr >= 0}
    if len(found.step_names) >= 2:  # HTA drops the last (usually incomplete) ProfilerStep's work
        last = max(ts for ts, _, is_step in host if is_step)
        keep = {corr for ts, corr, _ in host if ts < last and corr >= 0}
        gpu = [r for r in gpu if r[4] in keep or r[4] < 0 and r[0] < last]
    rows = [r for r in gpu if r[3] != -1]
    if found.device_events and not any(r[1] > r[0] for r in rows):
        problems.append(f"{found.device_events} GPU event(s) but no kernel, memcpy or memset with "
                        "a duration: no GPU breakdown")
    return rows, launches


def breakdown(rows: list[Row], launches: dict[int, float], top: int = 3) -> dict[str, Any] | None:
    """The GPU breakdown (see the module docstring); ``None`` without GPU activity.

    Durations in the result are in milliseconds, shares are fractions of the GPU span.
    """
    if not rows:
        return None
    busy = merge((r[0], r[1]) for r in rows)
    if not busy:
        return None
    types = [kernel_type(r[2]) for r in rows]
    compute = merge((r[0], r[1]) for r, t in zip(rows, types, strict=True) if t == "compute")
    comm = merge((r[0], r[1]) for r, t in zip(rows, types, strict=True) if t == "communication")
    span = busy[-1][1] - busy[0][0]
    if span <= 0:
        return None
    busy_us, compute_us, comm_us = total(busy), total(compute), total(comm)
    overlap_us = intersection(comm, compute)
    idle = idle_split(rows, launches)
    gaps = sum(idle.values())
    kernels = [r for r, t in zip(rows, types, strict=True) if t in ("compute", "communication")]
    delays = [r[0] - launches[r[4]] for r in kernels if r[4] in launches and r[0] >= launches[r[4]]]
    by_name: dict[str, float] = {}
    for r, t in zip(rows, types, strict=True):
        if t == "compute":
            by_name[r[2]] = by_name.get(r[2], 0.0) + r[1] - r[0]
    memcpy: dict[str, list[float]] = {}
    for r in rows:
        if r[2].startswith(COPY_NAME_PREFIX):
            acc = memcpy.setdefault(r[2], [0, 0.0])
            acc[0] += 1
            acc[1] += (r[1] - r[0]) / 1e3
    return {
        "span_ms": span / 1e3,
        "idle_share": (span - busy_us) / span,
        "compute_share": compute_us / span,
        "non_compute_share": (busy_us - compute_us) / span,
        "comm_share": comm_us / span,
        "comm_exposed_share": (comm_us - overlap_us) / span,
        "comm_overlap_share": overlap_us / comm_us if comm_us > 0 else None,
        "memcpy_share": total(merge((r[0], r[1]) for r, t in zip(rows, types, strict=True)
                                    if t == "memory")) / span,
        "idle_host_wait_share": idle["host_wait"] / gaps if gaps > 0 else None,
        "idle_kernel_wait_share": idle["kernel_wait"] / gaps if gaps > 0 else None,
        "idle_other_share": idle["other"] / gaps if gaps > 0 else None,
        "kernels": len(kernels),
        "short_kernel_share": (sum(1 for r in kernels if r[1] - r[0] < SHORT_KERNEL_US) / len(kernels)
                               if kernels else None),
        "launch_delay_median_us": statistics.median(delays) if delays else None,
        "memcpy": {name: {"count": int(c), "ms": ms} for name, (c, ms) in sorted(memcpy.items())},
        "top_kernels": [{"name": n, "ms": us / 1e3}
                        for n, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]],
        "busy": busy,
        "compute": compute,
    }


def idle_split(rows: list[Row], launches: dict[int, float]) -> dict[str, float]:
    """Idle gaps between consecutive kernels of each stream, by cause (us), as HTA splits them."""
    out = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    streams: dict[int, list[Row]] = {}
    for r in rows:
        streams.setdefault(r[3], []).append(r)
    for items in streams.values():
        items.sort()
        for prev, cur in zip(items, items[1:], strict=False):
            gap = cur[0] - prev[1]
            if gap <= 0:
                continue
            launch = launches.get(cur[4])
            if launch is not None and launch > prev[1]:
                out["host_wait"] += gap
            elif gap < KERNEL_WAIT_US:
                out["kernel_wait"] += gap
            else:
                out["other"] += gap
    return out


def step_shares(gpu: dict[str, Any], start: float, end: float) -> dict[str, float] | None:
    """GPU idle/compute/non-compute shares of one step range ``[start, end]`` (us)."""
    if end <= start:
        return None
    busy = total(clip(gpu["busy"], start, end))
    compute = total(clip(gpu["compute"], start, end))
    length = end - start
    return {"idle_share": (length - busy) / length, "compute_share": compute / length,
            "non_compute_share": (busy - compute) / length}


def public(gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """``gpu_breakdown`` of the report schema: the four HTA shares."""
    if gpu is None:
        return None
    return {k: gpu[k] for k in ("idle_share", "compute_share", "non_compute_share",
                                "comm_overlap_share")}
