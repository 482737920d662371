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
  ``record_param_comms``).
"""

from __future__ import annotations

from typing import Any

from profcallbacks.report.events import Scan, op_intervals
from profcallbacks.report.gpu import clip, total
from profcallbacks.report.intervals import merge, subtract


def host_side(found: Scan, steps: list[dict[str, Any]] | None = None, top: int = 3) -> dict[str, Any]:
    """Per-step host numbers of a scanned trace (see the module docstring).

    Args:
        found: The events' scan.
        steps: ``TraceSummary.steps`` of the same trace: their ``data_wait_ms`` and
            ``compute_ms`` (same definitions) are taken instead of merging every operator again.
        top: Sync calls to list.
    """
    syncs = list(found.syncs)
    syncs += [(*found.async_copies[c], "cudaMemcpyAsync") for c in found.blocking_copies
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
              "comm_call_ms": merge(found.comm)}
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
    keys = ("step_ms", "data_wait_ms", "cpu_ops_ms", "sync_ms", "optimizer_ms", "comm_call_ms")
    return {
        "per_step": per_step,
        "whole_span": whole_span,
        **{key: sum(r[key] for r in per_step) / n for key in keys},
        "top_syncs": [{"name": k, "calls": int(v[0]), "ms": v[1]}
                      for k, v in sorted(by_call.items(), key=lambda kv: -kv[1][1])[:top]],
    }


def _number(name: str) -> int:
    try:
        return int(name[len("ProfilerStep#"):])
    except ValueError:
        return -1
