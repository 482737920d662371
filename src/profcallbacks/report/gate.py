"""``compare --fail-if-slower``: the CI regression gate, and when a comparison is too noisy to gate.

How many steps a comparison needs. Step times on shared machines wander by 1.3-1.5x for stretches of
milliseconds to seconds (DESIGN.md, field notes), so one step says little. The steps files keep one
summary per ``log_every_n_steps`` steps with each healthy step's time, and the run's median is exact
over those steps. With a step-to-step spread (coefficient of variation) of about 0.3, the median of
n steps has a standard error of about 1.25 * 0.3 / sqrt(n): 3.8% at n = 100, 2.7% at n = 200. Two
runs compared add their errors (sqrt 2): about 5% at 100 steps each, so a 10% threshold is two
standard errors there and a 5% threshold needs about 400 steps per run. Hence the gate refuses (exit
2) below ``DEFAULT_MIN_STEPS`` steps or ``MIN_SUMMARIES`` step summaries per run, and reports its
own estimate of the noise (``gate["noise"]``, from the spread of the summaries' medians) so a
threshold below two standard errors is called out on the verdict line.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

DEFAULT_MIN_STEPS = 100
MIN_SUMMARIES = 5
"""Step summaries (rows of the steps files) a run needs: the median is taken over their medians."""
MIN_TRACED_STEPS = 6
"""Traced (profiled) steps a run needs for the ``traced_*`` metrics: two captures of three steps."""


@dataclass(frozen=True)
class Metric:
    """A number of the report that the gate compares; ``points``: a share, compared in points."""

    section: str
    key: str
    label: str
    points: bool = False


METRICS = {
    "median_step": Metric("steps", "median_ms", "median step time"),
    "mean_step": Metric("steps", "mean_ms", "mean step time"),
    "data_wait_share": Metric("steps", "data_wait_share", "data-wait share", points=True),
    "traced_step": Metric("breakdown", "step_ms", "traced step time"),
    "traced_compute": Metric("breakdown", "compute_ms", "traced compute time"),
    "traced_data_wait": Metric("breakdown", "data_wait_ms", "traced data wait"),
    "traced_other": Metric("breakdown", "other_ms", "traced other time"),
    "traced_gpu_kernel": Metric("breakdown", "gpu_kernel_ms", "traced GPU kernel time"),
}


def gate(base: dict[str, Any], new: dict[str, Any], *, fail_if_slower: float | None,
         metric: str = "median_step", fail_on_new_findings: tuple[str, ...] = (),
         min_steps: int = DEFAULT_MIN_STEPS) -> dict[str, Any]:
    """Judges NEW against BASE (two reports of ``build_report``).

    Args:
        fail_if_slower: Threshold in percent (in percentage points for a share), or ``None``.
        metric: A key of ``METRICS``.
        fail_on_new_findings: Finding kinds (or ``"any"``) that fail the gate when NEW has them
            and BASE has none.
        min_steps: Steps each run needs for a step-time metric.

    Returns:
        ``{"metric", "base", "new", "change", "threshold", "failed", "refused", "noise",
        "new_findings", "verdict", "exit_code"}``; ``change`` and ``noise`` in percent (points for
        a share); ``exit_code`` 0 passed, 1 failed, 2 refused.
    """
    spec = METRICS[metric]
    out: dict[str, Any] = {"metric": metric, "base": None, "new": None, "change": None,
                           "threshold": fail_if_slower, "failed": False, "refused": None, "noise": None,
                           "new_findings": []}
    reasons: list[str] = []
    if fail_if_slower is not None:
        refusal = _too_few(base, "BASE", spec, min_steps) or _too_few(new, "NEW", spec, min_steps)
        if refusal:
            out["refused"] = refusal
            return _finish(out, f"refused: {refusal}", 2)
        a, b = (r[spec.section][spec.key] for r in (base, new))
        change = (b - a) * 100 if spec.points else (b / a - 1) * 100 if a > 0 else math.inf
        out.update(base=a, new=b, change=change, noise=_noise(base, new, spec))
        unit = " pts" if spec.points else "%"
        if change > fail_if_slower:
            out["failed"] = True
            reasons.append(f"{spec.label} {change:+.1f}{unit} > {fail_if_slower:g}{unit}")
        else:
            reasons.append(f"{spec.label} {change:+.1f}{unit} <= {fail_if_slower:g}{unit}")
        if out["noise"] is not None and fail_if_slower < 2 * out["noise"]:
            reasons[-1] += (f" (noise about ±{out['noise']:.1f}{unit}: a threshold below two standard "
                            "errors; train more steps)")
    if fail_on_new_findings:
        kinds_a = {g["kind"] for g in base["findings_by_kind"]}
        wanted = set(fail_on_new_findings)
        fresh = [g["kind"] for g in new["findings_by_kind"]
                 if g["kind"] not in kinds_a and ("any" in wanted or g["kind"] in wanted)]
        out["new_findings"] = sorted(fresh)
        if fresh:
            out["failed"] = True
            reasons.append("new findings: " + ", ".join(sorted(fresh)))
        else:
            reasons.append("no new findings of " + ",".join(sorted(wanted)))
    line = ("regression: " if out["failed"] else "ok: ") + "; ".join(reasons)
    return _finish(out, line, 1 if out["failed"] else 0)


def _finish(out: dict[str, Any], line: str, code: int) -> dict[str, Any]:
    out["verdict"] = line
    out["exit_code"] = code
    return out


def _too_few(report: dict[str, Any], name: str, spec: Metric, min_steps: int) -> str | None:
    where = f"{name} ({report['logdir']})"
    section = report.get(spec.section)
    if not section or not isinstance(section.get(spec.key), (int, float)):
        source = "step summaries" if spec.section == "steps" else "traced steps"
        return f"{where} has no {spec.label} (no {source})"
    if spec.section == "breakdown":
        if section["steps"] < MIN_TRACED_STEPS:
            return (f"{where} has {section['steps']} traced steps; {spec.label} needs at least "
                    f"{MIN_TRACED_STEPS}")
        return None
    summaries = len(section.get("intervals") or [])
    if section["steps"] < min_steps:
        return (f"{where} has {section['steps']} steps; a comparison needs at least {min_steps} per run "
                "to tell a change from noise (--min-steps)")
    if summaries < MIN_SUMMARIES:
        return (f"{where} has {summaries} step summaries; the median needs at least {MIN_SUMMARIES} "
                "(lower log_every_n_steps or train longer)")
    return None


def _noise(base: dict[str, Any], new: dict[str, Any], spec: Metric) -> float | None:
    """Standard error of the change, in percent (points): from the spread of each run's summaries."""
    if spec.section != "steps":
        return None
    column = {"median_ms": "step_time_ms_median", "mean_ms": "step_time_ms",
              "data_wait_share": "data_wait_share"}[spec.key]
    errors = []
    for report in (base, new):
        values = [r[column] for r in report["steps"]["intervals"]]
        scale = 1.2533 if spec.key == "median_ms" else 1.0
        errors.append(scale * statistics.stdev(values) / math.sqrt(len(values)))
    combined = math.sqrt(sum(e * e for e in errors))
    a = base["steps"][spec.key]
    return combined * 100 if spec.points else combined / a * 100 if a > 0 else None
