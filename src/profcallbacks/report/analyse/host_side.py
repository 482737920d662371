"""Host side of one trace, per step: time blocked in syncs, optimizer, communication calls.

Per ``ProfilerStep#N`` range (the whole traced span when the trace has none), in milliseconds:

- ``sync_ms``: time covered by calls that block the host until the GPU catches up:
  ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, blocking
  ``cudaMemcpy*`` (``cudaMemcpy``, and ``cudaMemcpyAsync`` whose copy goes to pageable memory or
  device-to-host), ``aten::_local_scalar_dense`` and ``aten::item``;
- ``data_wait_ms``: time covered by dataloader ``__next__`` ranges (``enumerate(DataLoader)#...``);
- ``cpu_ops_ms``: time covered by CPU operators, data wait excluded;
- ``optimizer_ms``: time covered by ``Optimizer.step#...`` ranges;
- ``comm_call_ms``: time covered by host-side communication calls (``nccl:*``, ``c10d::*``,
  ``gloo:*``, ``record_param_comms``), on any thread;
- ``comm_exposed_ms``: the part of ``comm_call_ms`` during which no CPU operator computes: the
  operators that enclose a communication call (the backward op whose hook launched it) or lie
  inside one (its own bookkeeping) are not compute. On CPU runs this is what the step loses to
  communication, as HTA's exposed communication is on the GPU timeline.
"""

from __future__ import annotations

import bisect
from typing import Any

from profcallbacks.core.trace_names import ASYNC_COPY_CALL, STEP_PREFIX
from profcallbacks.report.analyse.gpu_breakdown import clip, total
from profcallbacks.report.model.intervals import merge, subtract
from profcallbacks.report.read.events import Scan, op_intervals


def host_side(found: Scan, steps: list[dict[str, Any]] | None = None, top: int = 3) -> dict[str, Any]:
    """Per-step host numbers of a scanned trace (see the module docstring).

    Args:
        found: The events' scan.
        steps: ``TraceSummary.steps`` of the same trace: their ``data_wait_ms`` and
            ``compute_ms`` (same definitions) are taken instead of merging every operator again.
        top: Sync calls to list.
    """
    syncs = list(found.syncs)
    syncs += [(*found.async_copies[c], ASYNC_COPY_CALL) for c in found.blocking_copies
              if c in found.async_copies]
    marks = found.steps
    if any(s[3] for s in marks):
        marks = [s for s in marks if s[3]]
    ranges = [(s[0], s[1], _number(s[2])) for s in sorted(marks)]
    ops: list[tuple[float, float]] | None = None
    whole_span = False
    if not ranges:
        ops, lo, hi = op_intervals(found)
        whole_span = hi > lo
        ranges = [(lo, hi, -1)] if whole_span else []
    merged = {"sync_ms": merge((s, e) for s, e, _ in syncs), "optimizer_ms": merge(found.optimizer),
              "comm_call_ms": merge(found.comm), "comm_exposed_ms": []}
    if found.comm:
        if ops is None:
            ops = op_intervals(found)[0]
        merged["comm_exposed_ms"] = subtract(merged["comm_call_ms"], merge(_compute(ops, found)))
    by_step = {s["step"]: s for s in steps or []} if len(steps or []) == len(ranges) else {}
    if not by_step:
        data = merge(found.data)
        merged["data_wait_ms"] = data
        if ops is None:
            ops = op_intervals(found)[0]
        merged["cpu_ops_ms"] = subtract(merge(ops), data)
    per_step = []
    for start, end, number in ranges:
        row: dict[str, Any] = {"step": number, "start_us": start, "end_us": end,
                               "step_ms": (end - start) / 1e3}
        if by_step:
            summary = by_step.get(number, {})
            row["data_wait_ms"] = summary.get("data_wait_ms", 0.0)
            row["cpu_ops_ms"] = summary.get("compute_ms", 0.0)
        for key, intervals in merged.items():
            row[key] = total(clip(intervals, start, end)) / 1e3
        per_step.append(row)
    by_call: dict[str, list[float]] = {}
    for s, e, name in syncs:
        acc = by_call.setdefault(name, [0, 0.0])
        acc[0] += 1
        acc[1] += (e - s) / 1e3
    n = max(len(per_step), 1)
    keys = ("step_ms", "data_wait_ms", "cpu_ops_ms", "sync_ms", "optimizer_ms", "comm_call_ms",
            "comm_exposed_ms")
    return {
        "per_step": per_step,
        "whole_span": whole_span,
        **{key: sum(r[key] for r in per_step) / n for key in keys},
        "top_syncs": [{"name": k, "calls": int(v[0]), "ms": v[1]}
                      for k, v in sorted(by_call.items(), key=lambda kv: -kv[1][1])[:top]],
    }


def _compute(ops: list[tuple[float, float]], found: Scan) -> list[tuple[float, float]]:
    """The operator intervals that compute: not a communication call, not enclosing one, not
    inside one made on the calling thread (``Scan.comm_ops``)."""
    calls = merge(found.comm_ops)
    starts = sorted(s for s, _ in found.comm)
    inner = {iv for iv in found.comm}
    out = []
    for s, e in ops:
        if (s, e) in inner:
            continue
        i = bisect.bisect_left(starts, s)
        if i < len(starts) and starts[i] < e:  # encloses a communication call
            continue
        j = bisect.bisect_right(calls, (s, float("inf"))) - 1
        if j >= 0 and calls[j][0] <= s and e <= calls[j][1]:  # inside a call
            continue
        out.append((s, e))
    return out


def _number(name: str) -> int:
    try:
        return int(name[len(STEP_PREFIX):])
    except ValueError:
        return -1
