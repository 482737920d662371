"""What changed between two runs: step time, data-wait share, operators, verdicts and findings."""

from __future__ import annotations

import sys
from typing import Any

from profcallbacks.report.analyse.expert import diagnosis_changes
from profcallbacks.report.build import SCHEMA_VERSION
from profcallbacks.report.render.safe import visible

ALL_OPERATORS = sys.maxsize
"""``build_report(run, top=ALL_OPERATORS)``: the full operator tables that a comparison needs."""
GPU_SHARES = ("idle_share", "compute_share", "non_compute_share", "comm_overlap_share")


def _change(a: float | None, b: float | None) -> dict[str, float | None]:
    ratio = b / a if a and b is not None else None
    return {"a": a, "b": b, "delta": None if a is None or b is None else b - a, "ratio": ratio}


def compare_reports(a: dict[str, Any], b: dict[str, Any], *, top: int = 15) -> dict[str, Any]:
    """A comparison of two reports made by ``build_report`` (schema in docs/reference/report-schema.md).

    Operators are compared by self time per traced step, so captures of different lengths
    compare fairly. Build both reports with ``top=ALL_OPERATORS``: an operator is ``new`` or
    ``gone`` only when it is missing from a run's full table, and ``top`` then cuts the rows to the
    biggest changes (with a cut table, an operator that only crossed the cut would look new).
    """
    sa, sb = a["steps"] or {}, b["steps"] or {}
    ba, bb = a["breakdown"] or {}, b["breakdown"] or {}
    steps = {key: _change(sa.get(key), sb.get(key))
             for key in ("mean_ms", "median_ms", "max_ms", "data_wait_ms", "data_wait_share")}
    traced = {key: _change(ba.get(key), bb.get(key))
              for key in ("step_ms", "data_wait_ms", "compute_ms", "other_ms", "gpu_kernel_ms",
                          "compiled_ms")}
    ca, cb = a.get("compile") or {}, b.get("compile") or {}
    return {
        "schema_version": SCHEMA_VERSION,
        "a": a["logdir"],
        "b": b["logdir"],
        "steps": steps,
        "breakdown": traced,
        "operators": {kind: _operators(a["top_operators"][kind], b["top_operators"][kind], top)
                      for kind in ("cpu", "gpu")},
        "verdict": {"a": a.get("verdict"), "b": b.get("verdict")},
        "gpu_breakdown": {key: _change(_mean_share(a, key), _mean_share(b, key)) for key in GPU_SHARES},
        "findings": _findings(a["findings_by_kind"], b["findings_by_kind"]),
        "diagnoses": diagnosis_changes(a.get("diagnoses") or [], b.get("diagnoses") or []),
        "compile": None if not (ca or cb) else {
            "compile_s": {"a": ca.get("compile_s", 0.0), "b": cb.get("compile_s", 0.0)},
            "recompiles": {"a": ca.get("recompiles", 0), "b": cb.get("recompiles", 0)},
            "fallbacks": {"a": len(ca.get("fallbacks", [])), "b": len(cb.get("fallbacks", []))},
            "graph_breaks": {"a": len({(g["file"], g["line"]) for g in ca.get("graph_breaks", [])}),
                             "b": len({(g["file"], g["line"]) for g in cb.get("graph_breaks", [])})}},
        "problems": a["problems"] + b["problems"],
    }


def _operators(a: list[dict[str, Any]], b: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    by_a = {o["name"]: o["self_ms_per_step"] for o in a}
    by_b = {o["name"]: o["self_ms_per_step"] for o in b}
    rows = []
    for name in dict.fromkeys([*by_a, *by_b]):
        ms_a, ms_b = by_a.get(name), by_b.get(name)
        rows.append({"name": name, "self_ms_per_step_a": ms_a, "self_ms_per_step_b": ms_b,
                     "delta_ms": (ms_b or 0.0) - (ms_a or 0.0),
                     "status": "new" if ms_a is None else "gone" if ms_b is None else "changed"})
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    return rows[:top]


def _mean_share(report: dict[str, Any], key: str) -> float | None:
    """Mean of one ``gpu_breakdown`` share over every trace file of the run (``None`` without)."""
    values = [f["gpu_breakdown"][key] for c in report.get("captures") or [] for f in c.get("files") or []
              if isinstance(f.get("gpu_breakdown"), dict)
              and isinstance(f["gpu_breakdown"].get(key), (int, float))]
    return sum(values) / len(values) if values else None


def _verdict_text(verdict: Any) -> str:
    if not isinstance(verdict, dict) or not verdict.get("kind"):
        return "-"
    share = verdict.get("share")
    return str(verdict["kind"]) + (f" ({share:.0%})" if isinstance(share, (int, float)) else "")


def _findings(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    count_a = {g["kind"]: g["count"] for g in a}
    count_b = {g["kind"]: g["count"] for g in b}
    rows = []
    for kind in sorted(set(count_a) | set(count_b)):
        ca, cb = count_a.get(kind, 0), count_b.get(kind, 0)
        status = "new" if ca == 0 else "gone" if cb == 0 else "same" if ca == cb else "changed"
        rows.append({"kind": kind, "count_a": ca, "count_b": cb, "status": status})
    return rows


def render_compare_text(cmp: dict[str, Any]) -> str:
    """The comparison as plain text."""
    out = ["profcallbacks compare", f"  A: {cmp['a']}", f"  B: {cmp['b']}", ""]
    labels = {"mean_ms": "mean step", "median_ms": "median step", "max_ms": "max step",
              "data_wait_ms": "data wait per step", "data_wait_share": "data-wait share"}
    if any(c["a"] is not None or c["b"] is not None for c in cmp["steps"].values()):
        out.append("Step time (whole run)                A            B       change")
        for key, label in labels.items():
            out.append(_line(label, cmp["steps"][key], share=key == "data_wait_share"))
        out.append("")  # traces alone (no step summaries on either side): nothing to show here
    out += ["Traced steps (mean per ProfilerStep range)"]
    for key, label in (("step_ms", "step"), ("data_wait_ms", "data wait"), ("compute_ms", "compute"),
                       ("other_ms", "other"), ("gpu_kernel_ms", "GPU kernels busy"),
                       ("compiled_ms", "torch.compile code")):
        out.append(_line(label, cmp["breakdown"][key]))
    verdicts = cmp.get("verdict") or {}
    if verdicts.get("a") or verdicts.get("b"):
        out += ["", f"Verdict: {_verdict_text(verdicts.get('a'))} -> {_verdict_text(verdicts.get('b'))}"]
    gpu = cmp.get("gpu_breakdown") or {}
    if any(c["a"] is not None or c["b"] is not None for c in gpu.values()):
        out += ["", "GPU time breakdown (mean share of each trace's GPU span)"]
        out += [_line(key.removesuffix("_share").replace("_", "-"), change, share=True)
                for key, change in gpu.items()]
    for kind, title in (("cpu", "CPU operators"), ("gpu", "GPU kernels")):
        rows = cmp["operators"][kind]
        if not rows:
            continue
        out += ["", f"{title}: biggest changes in self time per step"]
        for r in rows:
            a, b = r["self_ms_per_step_a"], r["self_ms_per_step_b"]
            name = r["name"] if len(r["name"]) <= 60 else r["name"][:57] + "..."
            out.append(f"  {name:<60} {_fmt(a):>10} -> {_fmt(b):>10}  {r['delta_ms']:+.3f} ms"
                       + ("" if r["status"] == "changed" else f"  ({r['status']})"))
    compiled = cmp.get("compile")
    if compiled:
        c = compiled
        out += ["", f"torch.compile: compile time {c['compile_s']['a']:.1f} s -> "
                f"{c['compile_s']['b']:.1f} s, recompiles {c['recompiles']['a']} -> "
                f"{c['recompiles']['b']}, fallbacks to eager {c['fallbacks']['a']} -> "
                f"{c['fallbacks']['b']}, graph breaks per step {c['graph_breaks']['a']} -> "
                f"{c['graph_breaks']['b']}"]
    out += _diagnosis_lines(cmp.get("diagnoses"))
    out += ["", "Findings (count A -> B)"]
    out += [f"  {r['kind']}: {r['count_a']} -> {r['count_b']} ({r['status']})"
            for r in cmp["findings"]] or ["  none in either run"]
    if cmp["problems"]:
        out += ["", "Files that could not be read"]
        out += [f"  {p['file']}: {p['error']}" for p in cmp["problems"]]
    return visible("\n".join(out) + "\n")  # no raw escape sequences reach a terminal


def _diagnosis_lines(changes: dict[str, Any] | None) -> list[str]:
    if not changes or not any(changes.values()):
        return []
    out = ["", "Diagnoses (possible gain per step, A -> B)"]
    out += [f"  {d['kind']}: appeared, up to {d['gain_ms']:.2f} ms" for d in changes["appeared"]]
    out += [f"  {d['kind']}: went (was up to {d['gain_ms']:.2f} ms)" for d in changes["went"]]
    out += [f"  {d['kind']}: {d['gain_ms_a']:.2f} -> {d['gain_ms_b']:.2f} ms ({d['delta_ms']:+.2f} ms)"
            for d in changes["changed"]]
    return out


def _fmt(value: float | None, share: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if share else f"{value:.2f} ms"


def _line(label: str, change: dict[str, float | None], share: bool = False) -> str:
    ratio = change["ratio"]
    if share and change["delta"] is not None:
        diff = f"{change['delta'] * 100:+.1f} pts"
    else:
        diff = "-" if ratio is None else f"{(ratio - 1):+.1%}"
    return f"  {label:<20} {_fmt(change['a'], share):>12} {_fmt(change['b'], share):>12} {diff:>12}"
