"""Diagnoses and throughput as report text and HTML (shared by ``report`` and ``compare``)."""

from __future__ import annotations

import html
import textwrap
from typing import Any

TOP_TEXT = 5
"""Diagnoses shown under the verdict in the text report."""


def _gain(d: dict[str, Any]) -> str:
    per = (d.get("details") or {}).get("per", "step")
    per = "in the traced span (no step markers)" if per == "capture" else "per step"
    return f"~{d['gain_ms']:.2f} ms {per} ({d['gain_share']:.0%})"


def diagnosis_lines(diagnoses: list[dict[str, Any]] | None, limit: int = TOP_TEXT,
                    said: list[str] | None = None) -> list[str]:
    """The top diagnoses, one block each: kind, gain, what, where, evidence, fix.

    ``said``: the verdict's advice lines, printed just above: a fix among them is pointed to, not
    repeated (one problem, one piece of advice).
    """
    if not diagnoses:
        return []
    out = ["Diagnoses (largest gain first: what each fix would save, its basis among the evidence)"]
    cold = next((d for d in diagnoses if d["kind"] == "cold_start"), None)
    if cold is not None:
        out.append("  ! this capture is not steady state: the verdict above includes its start-up; "
                   "the gains below leave it out")
    for d in diagnoses[:limit]:
        out += textwrap.wrap(f"{d['kind']}: {_gain(d)}: {d['what']}", 100,
                             initial_indent="  ", subsequent_indent="    ")
        if d.get("where"):
            out += textwrap.wrap(f"where: {d['where']}", 100, initial_indent="    ",
                                 subsequent_indent="      ")
        for line in d["evidence"]:
            out += textwrap.wrap(line, 100, initial_indent="    - ", subsequent_indent="      ")
        fixes = [line for line in d["fix"] if line not in (said or [])]
        if len(fixes) < len(d["fix"]):
            fixes.append("as in the verdict above")
        for line in fixes:
            out += textwrap.wrap(line, 100, initial_indent="    fix: ", subsequent_indent="         ")
    if len(diagnoses) > limit:
        out.append(f"  ... {len(diagnoses) - limit} more in --format json")
    return out + [""]


def flops_text(flops: float) -> str:
    """``flops`` with the unit that gives it three digits or fewer.

    Example:
        >>> flops_text(274432.0), flops_text(4.51e9)
        ('274 kFLOP', '4.51 GFLOP')
    """
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            value = flops / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    return f"{flops:.0f} FLOP"


def throughput_text(tp: dict[str, Any] | None) -> str | None:
    """One line: steps/s, FLOPs, achieved TFLOP/s and MFU with its denominator."""
    if not tp:
        return None
    parts = []
    if tp.get("steps_per_s"):
        parts.append(f"{tp['steps_per_s']:.2f} steps/s")
    if tp.get("achieved_tflops") is not None and not tp.get("device"):  # a CPU trace: no MFU
        parts.append(f"{flops_text(tp['flops_per_step'])} per step in matrix products, "
                     f"{flops_text(tp['achieved_tflops'] * 1e12)}/s")
    elif tp.get("achieved_tflops") is not None:
        parts.append(f"{tp['flops_per_step'] / 1e9:.2f} GFLOP per step, "
                     f"{tp['achieved_tflops']:.3f} TFLOP/s achieved")
        if tp.get("mfu") is not None:
            parts.append(f"MFU {tp['mfu']:.1%} of {tp['peak_tflops']:g} TFLOP/s "
                         f"({tp['peak_source']})")
        else:
            parts.append("MFU unknown (no peak for this device/dtype; pass --peak-tflops)")
    elif tp.get("device"):
        parts.append("no FLOPs in the trace (its operators' shapes were not recorded: "
                     "record_shapes=True, profcallbacks' default, gives FLOPs and MFU)")
    if not parts:
        return None
    where = ", ".join(x for x in (tp.get("device"), tp.get("dtype")) if x)
    return "throughput: " + "; ".join(parts) + (f" [{where}]" if where else "")


def diagnoses_html(diagnoses: list[dict[str, Any]] | None,
                   captures: list[dict[str, Any]] | None = None) -> str:
    """The run's diagnoses as an HTML table, then each capture's throughput line."""
    e = html.escape
    lines = [(c.get("directory", ""), throughput_text(c.get("throughput"))) for c in captures or []]
    rates = "".join(f"<li><code>{e(str(d))}</code>: {e(t)}</li>" for d, t in lines if t)
    rates = f"<h2 id=throughput>Throughput</h2><ul>{rates}</ul>" if rates else ""
    if not diagnoses:
        return rates
    rows = "".join(
        f"<tr data-kind=\"{e(d['kind'])}\"><td><code>{e(d['kind'])}</code></td>"
        f"<td class=num>{d['gain_ms']:.2f} ms ({d['gain_share']:.0%})</td><td>{e(d['what'])}"
        f"<br><small>{e('; '.join(d['evidence']))}</small></td>"
        f"<td>{e(d.get('where') or '-')}</td><td>{e(' '.join(d['fix']))}</td></tr>"
        for d in diagnoses)
    return ("<h2 id=diagnoses>Diagnoses</h2><table><tr><th>kind</th><th>gain per step (what "
            "the fix saves)</th><th>what</th><th>where</th><th>fix</th></tr>" + rows + "</table>" + rates)
