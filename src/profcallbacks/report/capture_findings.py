"""Live analysis of a capture just exported: ``capture_verdict`` and ``slowdown_diagnosis``.

Runs in the export worker, off the training thread; the findings it returns travel back to the
training thread, where the session emits them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from profcallbacks.capture.summary_file import SUMMARY_KEY
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.collector import gc_paused
from profcallbacks.core.trace_names import LOADER_PREFIXES
from profcallbacks.core.triggers import SLOWDOWN, UNHEALTHY_TRIGGERS
from profcallbacks.findings import CAPTURE_VERDICT, SLOWDOWN_DIAGNOSIS, Finding
from profcallbacks.report.analyse.advice import run_context
from profcallbacks.report.analyse.captures import analyse_trace, pool
from profcallbacks.report.analyse.expert import TOP_LIVE, fit_to_run
from profcallbacks.report.analyse.growth import CpuPerStep, describe, growth_pattern
from profcallbacks.report.analyse.rank_summary import summary_record
from profcallbacks.report.analyse.verdict import decide, label
from profcallbacks.report.read.traces import (
    TraceModel,
    read_parsed_trace,
    read_trace_bytes,
    read_trace_file,
)

log = logging.getLogger(__name__)

TOP_CHANGES = 8
MIN_DELTA_MS = 0.01
"""Per-step changes smaller than this (10 us) are clock noise and left out of a diagnosis."""
NOT_SLOWER = 1.05
"""A slowdown capture whose step is at most this factor of its baseline's holds no slowdown."""


def capture_profile(model: TraceModel, info: CaptureInfo, previous: str | None = None, *,
                    analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    """What later captures compare against: per-step metrics, verdict and operator times.

    ``previous`` is the verdict kind of the run's previous healthy capture: a close call keeps it.
    ``analysis``: the trace's ``analyse_trace`` when the caller has it already.
    """
    summary = model.summary
    analysis = analysis if analysis is not None else analyse_trace(model)
    metrics = pool([analysis["metrics"]]) if "metrics" in analysis else None
    steps = max(len(summary.steps), 1)
    context = run_context([summary.format], names=summary.cpu_ops,
                          world_size=info.rank.world_size)
    expert = {"diagnoses": analysis["diagnoses"], "throughput": analysis["throughput"]}
    return {"name": info.name, "trigger": info.trigger, "metrics": metrics,
            "diagnoses": fit_to_run(expert["diagnoses"], context),
            "throughput": expert["throughput"],
            "verdict": decide(metrics, context=context, previous=previous,
                              diagnoses=expert["diagnoses"]) if metrics else None,
            "cpu_ops": {n: r[1] / steps for n, r in summary.cpu_ops.items()
                        if not n.startswith(LOADER_PREFIXES)},  # that is "data wait"
            "gpu_ops": {n: r[1] / steps for n, r in summary.gpu_ops.items()},
            "cpu_per_step": _cpu_per_step(model, metrics)}


def _cpu_per_step(model: TraceModel, metrics: dict[str, Any] | None) -> CpuPerStep | None:
    """The process's CPU time and wait for a core per step, scaled to the trace's step (the
    counters' steps run from one ``prof.step()`` to the next), or ``None`` without them."""
    rows = model.capture.load_rows() if model.capture is not None else []
    wall = sum(r[0] for r in rows)
    if not metrics or wall <= 0:
        return None
    scale = metrics["step_ms"] / wall
    return CpuPerStep(sum(r[1] for r in rows) * scale, sum(r[2] for r in rows) * scale)


def capture_findings(trace_file: Path | dict[str, Any] | bytes, info: CaptureInfo,
                     history: list[dict[str, Any]]) -> list[Finding]:
    """Findings about one exported capture; appends its profile to ``history``.

    Args:
        trace_file: The capture's trace (a path, its JSON, or the trace already parsed).
        info: The capture window (name, trigger, steps, rank).
        history: Profiles of this run's earlier captures (``capture_profile``), oldest first.

    The profile appended to ``history`` carries the capture's summary record under
    ``SUMMARY_KEY`` (``report/analyse/rank_summary.py``): the export helper writes it next to the
    trace and removes it from the profile.

    Returns:
        ``capture_verdict`` (info), and for a ``slowdown`` capture with an earlier healthy one,
        ``slowdown_diagnosis``: what grew per step, largest first (warning), or, when the
        slowdown capture's steps were not slower than the healthy capture's, that (info).
    """
    # The collector is paused (3x faster parsing) only on a main thread: in the helper process.
    # On the thread fallback it would pause the training process's collector.
    paused = gc_paused() if threading.current_thread() is threading.main_thread() else nullcontext()
    with paused:
        if isinstance(trace_file, dict):
            model = read_parsed_trace(trace_file, Path(info.name))
        elif isinstance(trace_file, bytes):
            model = read_trace_bytes(trace_file, Path(info.name))
        else:
            model = read_trace_file(trace_file)
        if isinstance(trace_file, Path) and trace_file.parent.name.startswith(info.name):
            # the published directory: name-2, name-3 ... when an earlier run took the name
            info = dataclasses.replace(info, name=trace_file.parent.name)
        earlier = [p["verdict"]["kind"] for p in history
                   if p["trigger"] not in UNHEALTHY_TRIGGERS and p.get("verdict")]
        analysis = analyse_trace(model)
        profile = capture_profile(model, info, earlier[-1] if earlier else None,
                                  analysis=analysis)
        try:  # the summary never costs the verdict
            profile[SUMMARY_KEY] = summary_record(model, analysis, host=info.rank.host,
                                                     worker=info.rank.worker)
        except Exception as exc:
            log.warning("profcallbacks: no summary for capture %s (%s: %s); reports read its "
                        "trace.", info.name, type(exc).__name__, exc)
        del model, analysis
    step = info.steps[-1].step if info.steps else info.first_step
    findings = []
    verdict = profile["verdict"]
    if verdict is not None:
        leading = profile["diagnoses"][:TOP_LIVE]
        findings.append(Finding(
            CAPTURE_VERDICT, step, info.rank.rank, "info",
            f"capture {info.name}: {label(verdict)} ({verdict['share']:.0%}); "
            f"{verdict['evidence'][0]}. {_what_to_try(verdict['advice'][0], leading)}",
            {"capture": info.name, **verdict, "diagnoses": leading,
             "throughput": profile["throughput"],
             **({"directory": str(trace_file.parent.absolute())}
                if isinstance(trace_file, Path) else {})}))
    healthy = [p for p in history if p["trigger"] not in UNHEALTHY_TRIGGERS and p["metrics"]]
    if info.trigger == SLOWDOWN and healthy and profile["metrics"]:
        findings += _slowdown_diagnosis(healthy[-1], profile, info, step, verdict)
    history.append(profile)
    return findings


_WORD = re.compile(r"[a-z0-9_]+")


def _what_to_try(advice: str, leading: list[dict[str, Any]]) -> str:
    """The verdict's advice and the top diagnosis with its gain and fix; the diagnosis's fix alone
    where both open alike (the same fix said twice; the diagnosis's is the more specific). What
    follows ``Try:`` is cut where the report lists the message (``advice.without_advice``).

    Example:
        >>> top = [{"kind": "input_pipeline", "gain_ms": 9.6, "fix": ["Use 4 per core."]}]
        >>> _what_to_try("Raise num_workers.", top)
        'Try: Raise num_workers. Top diagnosis: input_pipeline, up to 9.60 ms per step: Use 4 per core.'
        >>> _what_to_try("Use 4 per core, or 8.", top)
        'Try: Use 4 per core. Top diagnosis: input_pipeline, up to 9.60 ms per step.'
    """
    if not leading:
        return f"Try: {advice}"
    top = leading[0]
    gain = f"Top diagnosis: {top['kind']}, up to {top['gain_ms']:.2f} ms per step"
    fix = top["fix"][0]
    if _WORD.findall(advice.lower())[:4] == _WORD.findall(fix.lower())[:4]:
        return f"Try: {fix} {gain}."
    return f"Try: {advice} {gain}: {fix}"


def _slowdown_diagnosis(before: dict[str, Any], profile: dict[str, Any], info: CaptureInfo,
                        step: int, verdict: dict[str, Any] | None) -> list[Finding]:
    """What grew from the healthy capture ``before`` to the slowdown capture ``profile``; when the
    slow capture's steps were not slower, that, and no operator blamed."""
    before_ms, after_ms = before["metrics"]["step_ms"], profile["metrics"]["step_ms"]
    head = f"step {before_ms:.2f} -> {after_ms:.2f} ms since capture {before['name']}; "
    growth = growth_pattern(_parts(before["metrics"]), _parts(profile["metrics"]),
                            {**before["cpu_ops"], **before["gpu_ops"]},
                            {**profile["cpu_ops"], **profile["gpu_ops"]},
                            before.get("cpu_per_step"), profile.get("cpu_per_step"))
    details: dict[str, Any] = {"before": before["name"], "after": info.name,
                               "before_step_ms": before_ms, "after_step_ms": after_ms,
                               "before_verdict": before["verdict"], "after_verdict": verdict,
                               "growth": growth}
    if after_ms <= NOT_SLOWER * before_ms:
        return [Finding(
            SLOWDOWN_DIAGNOSIS, step, info.rank.rank, "info",
            head + "the captured steps were not slower than the baseline capture's, so the capture "
            "holds no slowdown to explain: it passed before the capture, or the baseline was "
            "taken while the machine was slow (other jobs, throttling); no operator is blamed",
            {**details, "changes": [], "slower": False})]
    changes = diagnose(before, profile)
    if not changes:
        return []
    top, clause = changes[0], describe(growth)
    return [Finding(
        SLOWDOWN_DIAGNOSIS, step, info.rank.rank, "warning",
        head + (f"{clause}; " if clause else "")
        + f"grew most: {top['what']} {top['before_ms']:.2f} -> {top['after_ms']:.2f} ms per step",
        {**details, "changes": changes, "slower": True})]


def _parts(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's parts (ms per step) that add up to it, for ``growth.growth_pattern``."""
    data, ops = metrics["data_wait_ms"], metrics["cpu_ops_ms"]
    return {"data wait": data, "CPU operators": ops,
            "other": max(metrics["step_ms"] - data - ops, 0.0)}


def diagnose(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What grew per step from ``before`` to ``after`` (profiles), largest first."""
    mb, ma = before["metrics"], after["metrics"]
    rows = [("data wait", mb["data_wait_ms"], ma["data_wait_ms"]),
            ("host sync time", mb["sync_ms"], ma["sync_ms"])]
    gb, ga = mb.get("gpu"), ma.get("gpu")
    if gb and ga:
        rows.append(("GPU idle", gb["idle_share"] * mb["step_ms"], ga["idle_share"] * ma["step_ms"]))
    for kind in ("cpu_ops", "gpu_ops"):
        for name in set(before[kind]) | set(after[kind]):
            rows.append((name, before[kind].get(name, 0.0), after[kind].get(name, 0.0)))
    changes = [{"what": what, "before_ms": b, "after_ms": a, "delta_ms": a - b}
               for what, b, a in rows if a - b >= MIN_DELTA_MS]
    changes.sort(key=lambda c: -c["delta_ms"])
    return changes[:TOP_CHANGES]
