"""One trace's summary record: what a report needs of a rank's trace, in a few kilobytes.

The export helper builds it from the analysis it runs on each capture anyway; ``profcallbacks
summarize`` builds it for traces the library did not write. ``capture/summary_file.py`` writes it
next to the trace, ``report/read/summaries.py`` reads it back into the report's ``TraceSummary``.

Collectives (``collectives``): per captured step, each collective call of the rank in order, as
``[step index, arrival ms after the step's start, wait ms]``. The wait is the call's duration: a
rank that arrives early waits in the collective for the last one, so the rank the others wait
for is the one with the shortest waits (``report/analyse/ranks.py``). NCCL kernels are used where
the trace has them (their duration holds the wait), else the backend's own ranges on the host
(``gloo:*`` on gloo's threads), else the collective operators of the calling thread.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from profcallbacks._version import __version__
from profcallbacks.core.trace_names import NCCL_KERNEL_PREFIX
from profcallbacks.report.analyse.captures import pool
from profcallbacks.report.analyse.verdict import decide
from profcallbacks.report.model.intervals import merge
from profcallbacks.report.read.events import Scan
from profcallbacks.report.read.traces import TraceModel, TraceSummary

TOP_OPS = 200
"""Operators kept per kind (CPU, GPU), largest total first: the report's tables use the top few."""
MAX_CALLS = 4096
"""Collective calls kept per trace (the first ones): arrival order needs a few steps, not all."""
_WORKER_HOST = re.compile(r"^rank\d+_(.+)$")


def host_of(worker: str) -> str:
    """The host in a worker name: ``rank3_node-b`` (ours) or ``node-b_12345`` (torch's
    ``tensorboard_trace_handler``: host, then pid); the worker itself otherwise."""
    ours = _WORKER_HOST.match(worker)
    if ours:
        return ours.group(1)
    head, _, tail = worker.rpartition("_")
    return head if head and tail.isdigit() else worker


def collective_calls(found: Scan | None, steps: list[dict[str, Any]]) -> list[list[float]]:
    """``[step index, arrival ms, wait ms]`` of each collective of the captured steps."""
    if found is None or not found.steps:
        return []
    nccl = [(r[0], r[1]) for r in found.gpu if r[2].startswith(NCCL_KERNEL_PREFIX)]
    launched = set(found.comm_ops)  # the calling thread's ops: gloo waits on a thread of its own
    backend = [c for c in found.comm if c not in launched]
    calls = merge(nccl or backend or found.comm_ops)
    ranges = sorted((s[0], s[1]) for s in found.steps)
    out: list[list[float]] = []
    index = 0
    for start, end in calls:
        while index < len(ranges) and ranges[index][1] <= start:
            index += 1
        if index == len(ranges):
            break
        step_start, step_end = ranges[index]
        if start < step_start or end > step_end + (step_end - step_start):
            continue
        out.append([index, round((start - step_start) / 1e3, 4), round((end - start) / 1e3, 4)])
        if len(out) >= MAX_CALLS:
            break
    return out


def _top(ops: dict[str, list[float]], at: int) -> dict[str, list[float]]:
    return dict(sorted(ops.items(), key=lambda kv: -kv[1][at])[:TOP_OPS])


def _lean(analysis: dict[str, Any]) -> dict[str, Any]:
    """``analysis`` without the GPU busy and compute interval lists (only per-step shares, already
    computed, read them)."""
    out = dict(analysis)
    for key in ("gpu",):
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k not in ("busy", "compute")}
    metrics = out.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("gpu"), dict):
        out["metrics"] = dict(metrics, gpu={k: v for k, v in metrics["gpu"].items()
                                            if k not in ("busy", "compute")})
    return out


def summary_record(model: TraceModel, analysis: dict[str, Any], *, host: str | None = None,
                   worker: str | None = None) -> dict[str, Any]:
    """The summary record of one trace read into ``model`` and analysed into ``analysis``
    (``analyse_trace``); ``worker`` and ``host`` default to the trace file's (the export helper
    reads the trace before it has a file name: it gives its own)."""
    summary: TraceSummary = model.summary
    metrics = pool([analysis["metrics"]]) if analysis.get("metrics") else None
    verdict = decide(metrics, diagnoses=analysis.get("diagnoses") or []) if metrics else None
    return {
        "generator": f"profcallbacks {__version__}",
        "rank": summary.rank, "world_size": summary.world_size, "worker": worker or summary.worker,
        "host": host or host_of(worker or summary.worker), "trigger": summary.trigger,
        "partial": summary.partial, "export_overlap": summary.export_overlap,
        "budget": summary.budget, "bad_events": summary.bad_events,
        "bad_example": summary.bad_example,
        "trace_format": dataclasses.asdict(summary.format),
        "steps": summary.steps,
        "cpu_ops": _top(summary.cpu_ops, 1), "gpu_ops": _top(summary.gpu_ops, 1),
        "verdict": None if verdict is None else {k: verdict[k] for k in ("kind", "share",
                                                                          "close_to")},
        "analysis": _lean(analysis),
        "collectives": collective_calls(model.scan, summary.steps),
    }
