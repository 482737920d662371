"""Runs every rule over one capture in a fixed order and ranks what they found by gain.

``cold_start`` runs first: it marks the cold part that every later rule leaves out of its step.
A rule that fails on an odd trace is logged and skipped; the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from profcallbacks.report.analyse.critical_path import CriticalPath, critical_path
from profcallbacks.report.analyse.diagnoses.allocator import allocator_churn
from profcallbacks.report.analyse.diagnoses.attention import attention_math_fallback
from profcallbacks.report.analyse.diagnoses.contention import oversubscribed
from profcallbacks.report.analyse.diagnoses.copies import hidden_copies, pageable_copy
from profcallbacks.report.analyse.diagnoses.dispatch import dispatch_bound
from profcallbacks.report.analyse.diagnoses.host_waits import launch_bound, sync_in_step
from profcallbacks.report.analyse.diagnoses.loader import input_pipeline
from profcallbacks.report.analyse.diagnoses.model import MIN_GAIN_SHARE, MIN_GPU_SHARE, Capture, Diagnosis
from profcallbacks.report.analyse.diagnoses.optimizer import grad_accumulation_sync, unfused_optimizer
from profcallbacks.report.analyse.diagnoses.precision import fp32_compute
from profcallbacks.report.analyse.diagnoses.startup import cold_start
from profcallbacks.report.analyse.diagnoses.whatif import bound_by_path, bound_gains
from profcallbacks.report.read.capture_model import build_capture

log = logging.getLogger(__name__)
Rule = Callable[[Capture], Diagnosis | None]
RULES: tuple[Rule, ...] = (cold_start, fp32_compute, pageable_copy, sync_in_step, launch_bound,
                           dispatch_bound, allocator_churn, unfused_optimizer,
                           attention_math_fallback, hidden_copies, input_pipeline,
                           grad_accumulation_sync, oversubscribed)
KINDS = tuple(rule.__name__ for rule in RULES)
"""Every diagnosis kind, in the order the rules run."""


def run_rules(cap: Capture) -> list[Diagnosis]:
    """Every diagnosis of ``cap`` worth at least ``MIN_GAIN_SHARE`` of its step (or
    ``MIN_GPU_SHARE`` of its kernel time), largest gain first, each gain bounded by its side's
    part of the critical path (``whatif.bound_by_path``) and by what the larger ones leave of the
    step (``whatif.bound_gains``)."""
    return diagnose(cap)[0]


def diagnose(cap: Capture) -> tuple[list[Diagnosis], CriticalPath | None]:
    """``run_rules``'s diagnoses and the critical path they were bounded by (``None`` on a CPU
    run or when the path could not be read)."""
    found: list[Diagnosis] = []
    for rule in RULES:
        try:
            diagnosis = rule(cap)
        except Exception as exc:  # one odd trace never costs the report its other rules
            log.warning("profcallbacks: diagnosis rule %s skipped (%s: %s)", rule.__name__,
                        type(exc).__name__, exc)
            continue
        if diagnosis is not None and (diagnosis.gain_share >= MIN_GAIN_SHARE or
                                      diagnosis.details.get("gpu_share", 0.0) >= MIN_GPU_SHARE):
            found.append(diagnosis)
    path = _path(cap)
    found = [d for d in bound_by_path(found, path) if d.gain_share >= MIN_GAIN_SHARE
             or d.details.get("gpu_share", 0.0) >= MIN_GPU_SHARE]
    found.sort(key=lambda d: -d.gain_ms)
    found = bound_gains(found, cap.step_ms())
    for d in found:
        d.details["per"] = "capture" if cap.whole_span else "step"
    return found, path


def with_gpu_span(cap: Capture) -> Capture:
    """``cap``, or for a trace of GPU events alone (no CPU operators, so no host span) the same
    capture with the GPU's span as its one step (``whole_span``): its kernels are read."""
    if cap.span_ms() > 0 or not cap.has_gpu:
        return cap
    start, end = min(k.ts for k in cap.kernels), max(k.end for k in cap.kernels)
    return replace(cap, steps=[(start, end, -1)], whole_span=True)


def _path(cap: Capture) -> CriticalPath | None:
    """The capture's critical path, after ``cold_start`` marked the cold part; ``None`` when it
    cannot be read (the diagnoses stand without the bound)."""
    try:
        return critical_path(cap)
    except Exception as exc:  # an odd trace costs the gains their path bound, nothing else
        log.warning("profcallbacks: no critical path for a trace (%s: %s)", type(exc).__name__, exc)
        return None


def diagnose_events(events: list[Any], properties: Any = None,
                    sync_sites: list[str] | None = None) -> tuple[list[Diagnosis], Capture]:
    """The diagnoses of one trace's decoded events (and the capture the rules read)."""
    cap = build_capture(events, properties)
    cap.sync_sites = list(sync_sites or [])
    return run_rules(cap), cap
