"""Diagnoses and throughput of traces, pooled per capture and per run, and compared between runs.

``trace_expert`` runs over one decoded trace; ``pool_diagnoses`` keeps, per kind, the costliest
diagnosis of a capture's files (ranks) or of a run's captures, naming where else it was seen;
``diagnosis_changes`` says which kinds appeared or went between two runs and how the gain moved.
"""

from __future__ import annotations

import logging
from typing import Any

from profcallbacks.report.analyse.advice import RunContext, verdict_advice
from profcallbacks.report.analyse.diagnoses import diagnose_events
from profcallbacks.report.analyse.diagnoses.throughput import throughput

log = logging.getLogger(__name__)
TOP_LIVE = 3
"""Diagnoses carried by a live ``capture_verdict`` finding."""


def trace_expert(events: list[Any], properties: Any = None,
                 sync_sites: list[str] | None = None) -> dict[str, Any]:
    """``{"diagnoses": [...], "throughput": {...}}`` of one trace (diagnosis dicts, best first)."""
    try:
        found, cap = diagnose_events(events, properties, sync_sites)
        return {"diagnoses": [d.to_dict() for d in found], "throughput": throughput(cap)}
    except Exception as exc:  # the rest of the report stands without them
        log.warning("profcallbacks: no diagnoses for a trace (%s: %s)", type(exc).__name__, exc)
        return {"diagnoses": [], "throughput": None}


_FRAMEWORK_FIX = {
    ("unfused_optimizer", "hf"): "TrainingArguments(optim='adamw_torch_fused') (the Trainer's "
                                 "fused AdamW).",
    ("unfused_optimizer", "lightning"): "Return torch.optim.AdamW(self.parameters(), ..., "
                                        "fused=True) from configure_optimizers.",
    ("launch_bound", "hf"): "TrainingArguments(torch_compile=True) compiles the model for you.",
    ("launch_bound", "lightning"): "model = torch.compile(model) before trainer.fit(model).",
    ("grad_accumulation_sync", "hf"): "The Trainer skips the sync for its own "
                                      "gradient_accumulation_steps: check a custom training_step "
                                      "or a second backward per step.",
    ("grad_accumulation_sync", "lightning"): "Trainer(accumulate_grad_batches=N) skips the sync "
                                             "for you; with manual optimization wrap all but the "
                                             "last micro-batch in self.trainer.strategy."
                                             "block_backward_sync(...).",
}
"""A first fix in the front end's own terms, where the run's framework is known."""


def fit_to_run(diagnoses: list[dict[str, Any]], context: RunContext | None) -> list[dict[str, Any]]:
    """``diagnoses`` with fixes in the run's own terms: the loader settings the stall detector read
    (the same advice as the ``input_bound`` verdict's, so the report gives one) and the framework's
    way of doing a fix (``TrainingArguments(optim=...)``, ``configure_optimizers`` ...)."""
    if context is None:
        return diagnoses
    out = []
    for d in diagnoses:
        d = dict(d)
        if d["kind"] == "input_pipeline" and (context.loader or context.loader_advice):
            settings = ", ".join(f"{k}={context.loader[k]}" for k in
                                 ("num_workers", "pin_memory", "persistent_workers",
                                  "prefetch_factor") if k in context.loader)
            if settings:
                d["evidence"] = [*d["evidence"], f"the loader in use: {settings}"]
            d["fix"] = verdict_advice("input_bound", context)
        framework_fix = _FRAMEWORK_FIX.get((d["kind"], context.framework or ""))
        if framework_fix:
            d["fix"] = [framework_fix, *d["fix"]]
        out.append(d)
    return out


def pool_diagnoses(groups: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per kind, the costliest of ``(source, diagnoses)`` groups, with ``seen_in`` (the sources
    where that kind was found); largest gain first."""
    best: dict[str, dict[str, Any]] = {}
    seen: dict[str, list[str]] = {}
    for source, diagnoses in groups:
        for d in diagnoses:
            seen.setdefault(d["kind"], []).append(source)
            if d["kind"] not in best or d["gain_ms"] > best[d["kind"]]["gain_ms"]:
                best[d["kind"]] = d
    out = [dict(d, seen_in=list(dict.fromkeys(seen[k]))) for k, d in best.items()]
    out.sort(key=lambda d: -d["gain_ms"])
    return out


def pool_throughput(rows: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The mean of several files' throughput (ranks of one capture); None without any."""
    known = [r for r in rows if r]
    if not known:
        return None
    out = dict(known[0])
    for key in ("step_ms", "steps_per_s", "flops_per_step", "achieved_tflops", "mfu"):
        values = [r[key] for r in known if r.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def with_peak(row: dict[str, Any] | None, peak_tflops: float | None) -> dict[str, Any] | None:
    """``row`` with its MFU against ``peak_tflops`` (the override for unknown devices)."""
    if row is None or peak_tflops is None:
        return row
    achieved = row.get("achieved_tflops")
    return dict(row, peak_tflops=peak_tflops, peak_source="given",
                mfu=achieved / peak_tflops if achieved is not None else None)


def diagnosis_changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Kinds that ``appeared``/``went`` from run A to run B, and the gain change of the others."""
    a = {d["kind"]: d for d in before}
    b = {d["kind"]: d for d in after}
    return {"appeared": [{"kind": k, "gain_ms": b[k]["gain_ms"], "what": b[k]["what"]}
                         for k in b if k not in a],
            "went": [{"kind": k, "gain_ms": a[k]["gain_ms"], "what": a[k]["what"]}
                     for k in a if k not in b],
            "changed": [{"kind": k, "gain_ms_a": a[k]["gain_ms"], "gain_ms_b": b[k]["gain_ms"],
                         "delta_ms": b[k]["gain_ms"] - a[k]["gain_ms"]} for k in a if k in b]}
