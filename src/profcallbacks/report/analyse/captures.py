"""Per-file and per-capture analysis: GPU breakdown, host side per step, metrics and verdict.

``analyse_trace`` reads one trace's model (``read/traces.py``: ``TraceModel``);
``capture_analysis`` pools the files of one capture (the ranks) into one set of per-step metrics
and a verdict; ``run_verdict`` pools the healthy
captures of a run (every trigger but ``slowdown``).
"""

from __future__ import annotations

import logging
from typing import Any

from profcallbacks.core.trace_names import LOADER_PREFIXES
from profcallbacks.core.triggers import UNHEALTHY_TRIGGERS
from profcallbacks.report.analyse import gpu_breakdown as gpu_mod
from profcallbacks.report.analyse.advice import RunContext
from profcallbacks.report.analyse.diagnoses.registry import diagnose, with_gpu_span
from profcallbacks.report.analyse.diagnoses.startup import graph_capture
from profcallbacks.report.analyse.diagnoses.throughput import throughput
from profcallbacks.report.analyse.expert import pool_diagnoses
from profcallbacks.report.analyse.host_side import host_side
from profcallbacks.report.analyse.metrics_fold import METRIC_KEYS, CaptureFold, MetricsFold
from profcallbacks.report.analyse.verdict import decide
from profcallbacks.report.model.capture import Capture
from profcallbacks.report.read.events import Scan
from profcallbacks.report.read.traces import TraceModel

log = logging.getLogger(__name__)

_METRIC_KEYS = METRIC_KEYS


def analyse_trace(model: TraceModel) -> dict[str, Any]:
    """The analysis of one trace file: ``analyse_scan``'s dict with the trace's ``diagnoses`` and
    ``throughput`` (``capture_expert``); a part that fails is a named problem, the rest stands."""
    summary = model.summary
    analysis: dict[str, Any]
    try:
        if model.scan is None:
            raise _Failed(model.failure)
        analysis = analyse_scan(model.scan, summary.cpu_ops, summary.steps)
    except Exception as exc:  # the verdict is lost, the rest of the file is still reported
        why = str(exc) if isinstance(exc, _Failed) else f"{type(exc).__name__}: {exc}"
        analysis = {"problems": [f"no GPU breakdown or verdict ({why})"]}
    analysis.update(capture_expert(model.capture))
    if "metrics" in analysis:  # the verdict reads the same path and precision as the diagnoses
        analysis["metrics"]["critical_path"] = analysis.get("critical_path")
        analysis["metrics"]["dtype"] = (analysis.get("throughput") or {}).get("dtype")
        analysis["metrics"]["graph_capture"] = analysis.get("graph_capture")
    return analysis


class _Failed(Exception):
    """The read stage could not scan the trace (its message says why)."""


def capture_expert(capture: Capture | None) -> dict[str, Any]:
    """``{"diagnoses": [...], "throughput": {...}, "critical_path": {...}}`` of one capture model
    (diagnoses best first; ``critical_path``: ``CriticalPath.to_dict()`` or ``None``)."""
    if capture is None:
        return {"diagnoses": [], "throughput": None, "critical_path": None}
    try:
        capture = with_gpu_span(capture)
        found, path = diagnose(capture)
        return {"diagnoses": [d.to_dict() for d in found], "throughput": throughput(capture),
                "critical_path": path.to_dict() if path is not None and path.steps else None,
                "graph_capture": graph_capture(capture)}
    except Exception as exc:  # the rest of the report stands without them
        log.warning("profcallbacks: no diagnoses for a trace (%s: %s)", type(exc).__name__, exc)
        return {"diagnoses": [], "throughput": None, "critical_path": None}


def analyse_scan(found: Scan, cpu_ops: dict[str, list[float]],
                 steps: list[dict[str, Any]] | None = None, top: int = 3) -> dict[str, Any]:
    """The analysis of one trace's scan; ``cpu_ops`` and ``steps`` are ``TraceSummary``'s.

    Returns a dict with ``gpu`` (full breakdown or ``None``), ``gpu_breakdown`` (the four report
    shares or ``None``), ``host`` (per-step host numbers), ``metrics`` and ``problems``.
    """
    problems: list[str] = []
    rows, launches = gpu_mod.gpu_rows(found, problems)
    gpu = gpu_mod.breakdown(rows, launches, top)
    host = host_side(found, steps, top)
    if gpu is not None:
        for row in host["per_step"]:
            row["gpu"] = gpu_mod.step_shares(gpu, row["start_us"], row["end_us"])
    n_steps = max(len(host["per_step"]), 1)
    metrics: dict[str, Any] = {k: host[k] for k in _METRIC_KEYS}
    metrics["steps"] = len(host["per_step"])
    metrics["gpu"] = gpu
    metrics["top_syncs"] = [dict(r, ms=r["ms"] / n_steps) for r in host["top_syncs"]]
    ops = [(n, r) for n, r in cpu_ops.items() if not n.startswith(LOADER_PREFIXES)]
    metrics["top_cpu_ops"] = [{"name": n, "self_ms": r[1] / n_steps}
                              for n, r in sorted(ops, key=lambda kv: -kv[1][1])[:top]]
    return {"gpu": gpu, "gpu_breakdown": gpu_mod.public(gpu), "host": host, "metrics": metrics,
            "problems": problems}


def pool(metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Per-step metrics over several files or captures (step-weighted means)."""
    fold = MetricsFold()
    for m in metrics:
        fold.add(m)
    return fold.result()


def capture_analysis(files: list[dict[str, Any]], sync_sites: list[str], *,
                     context: RunContext | None = None,
                     previous: str | None = None) -> dict[str, Any]:
    """``metrics`` (pooled over the capture's files), ``verdict``, ``diagnoses`` and
    ``throughput`` of one capture.

    ``previous`` is the verdict kind of the run's previous healthy capture (``decide``'s
    hysteresis); ``context`` fits the advice to the run.
    """
    fold = CaptureFold()
    for f in files:
        fold.add(f)
    return fold.result(sync_sites, context=context, previous=previous)


def run_verdict(captures: list[dict[str, Any]], sync_sites: list[str], *,
                context: RunContext | None = None) -> dict[str, Any] | None:
    """The run's verdict over its healthy captures (all captures when none is healthy).

    A close call keeps the kind most of those captures got (hysteresis over the run).
    """
    healthy = [c for c in captures if c.get("trigger") not in UNHEALTHY_TRIGGERS and c.get("metrics")]
    chosen = healthy or [c for c in captures if c.get("metrics")]
    metrics = pool([c["metrics"] for c in chosen])
    kinds = [c["verdict"]["kind"] for c in chosen if c.get("verdict")]
    usual = max(kinds, key=kinds.count) if kinds else None
    diagnoses = pool_diagnoses([(str(c.get("directory")), c.get("diagnoses") or []) for c in chosen])
    return (decide(metrics, sync_sites, context=context, previous=usual, diagnoses=diagnoses)
            if metrics else None)


def rank_verdicts(files: list[dict[str, Any]], sync_sites: list[str], *,
                  context: RunContext | None = None) -> list[dict[str, Any]]:
    """Each rank's own verdict in one capture: ``{"rank", "kind", "share", "close_to"}``."""
    out = []
    for f in files:
        metrics = pool([f["metrics"]])
        verdict = (decide(metrics, sync_sites, context=context, diagnoses=f.get("diagnoses") or [])
                   if metrics else None)
        if verdict is not None:
            out.append({"rank": f.get("rank"), "kind": verdict["kind"], "share": verdict["share"],
                        "close_to": verdict["close_to"]})
    return out


def public_metrics(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """The JSON-friendly per-step numbers of a capture (no interval lists)."""
    if metrics is None:
        return None
    out = {k: metrics[k] for k in (*_METRIC_KEYS, "steps", "top_syncs", "top_cpu_ops")}
    out["critical_path"] = metrics.get("critical_path")
    gpu = metrics.get("gpu")
    out["gpu"] = None if gpu is None else {k: v for k, v in gpu.items() if k not in ("busy", "compute")}
    return out
