"""The report as one self-contained HTML page: inline CSS and SVG, no scripts, nothing fetched.

Every string taken from traces, findings or file names goes through ``html.escape``: operator and
frame names are arbitrary strings.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from profcallbacks.report.analyse.advice import without_advice
from profcallbacks.report.analyse.compile import compile_text
from profcallbacks.report.analyse.fmt import ms as _ms
from profcallbacks.report.analyse.fmt import pct as _pct
from profcallbacks.report.analyse.memory import memory_html
from profcallbacks.report.analyse.verdict import label
from profcallbacks.report.read.budgets import budget_lines
from profcallbacks.report.render.expert_render import diagnoses_html
from profcallbacks.report.render.plot import step_time_svg
from profcallbacks.report.render.ranks_text import LISTED_FILES, job_lines
from profcallbacks.report.render.safe import visible
from profcallbacks.report.render.text import step_spread
from profcallbacks.report.render.workers_render import workers_html

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1000px;
color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0;max-width:100%}
td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left;overflow-wrap:anywhere}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:13px}
.meta{color:#666}.tick{font-size:11px;fill:#555}.axis{font-size:12px;fill:#333}
.legend span{margin-right:16px;font-size:12px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle}
.bar{display:flex;height:26px;width:100%;max-width:900px;border:1px solid #ccc}.bar div{height:100%}
.sev-error{color:#b71c1c;font-weight:600}.sev-warning{color:#e65100;font-weight:600}.sev-info{color:#1565c0}
.verdict{border:2px solid #1565c0;border-radius:6px;padding:8px 16px;margin:12px 0;background:#f5f9ff}
.verdict h2{border:0;margin:4px 0}.verdict ul{margin:4px 0}
.finding{border-left:4px solid #ccc;padding:4px 12px;margin:10px 0}.advice{color:#2e7d32}
ul.lines{list-style:none;padding-left:0}ul.lines .l2{padding-left:24px}ul.lines .l3{padding-left:48px}
details pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}.problems li{color:#b71c1c}
"""
_BREAKDOWN_COLOURS = {"data_wait": "#ff7f0e", "compute": "#1f77b4", "other": "#bbb"}


def _e(value: Any) -> str:
    return escape(str(value))


def _table(headers: list[str], rows: list[list[str]],
           numeric: set[int] | frozenset[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: dict[str, Any]) -> str:
    """The report as a complete HTML document (cells are escaped here, never by the caller)."""
    steps = report["steps"]
    parts = [f"<h1>profcallbacks report</h1><p class=meta>{_e(report['logdir'])} &middot; ranks "
             f"{_e(', '.join(map(str, report['ranks'])) or '-')} (world size {report['world_size']}) "
             f"&middot; {_e(report['generator'])}</p>"]
    parts.append(_verdict_panel(report))
    parts.append(diagnoses_html(report.get("diagnoses"), report.get("captures")))
    if report.get("foreign"):
        parts.append("<p id=foreign>Traces not written by profcallbacks: no step summaries or "
                     "findings files; what follows is read from the traces alone.</p>")
    for r in report.get("earlier_runs") or []:
        parts.append(f"<p class=earlier-run>An earlier run (run {_e(r['run'])}: steps "
                     f"{_e(r['first_step'])}-{_e(r['last_step'])}, {_e(r['findings'])} finding(s), "
                     f"captures {_e(', '.join(r['captures']) or '-')}) wrote into this log "
                     "directory too; it is not merged into this report.</p>")
    parts.append("<h2>Step time over the run</h2>" + step_time_svg(report))
    if steps:
        parts.append(f"<p id=step-stats>Steps {steps['first_step']}-{steps['last_step']} "
                     f"({steps['steps']} steps): {_e(step_spread(steps))}; "
                     f"data wait {_ms(steps['data_wait_ms'])} per step "
                     f"(<b>{_pct(steps['data_wait_share'])}</b>).</p>")
        parts.append(_ranks(steps))
    if report["breakdown"] is not None or not report.get("foreign"):
        parts.append(_breakdown(report["breakdown"]))
    parts.append(memory_html(report.get("memory")))
    parts.append(_lines_section("compile", compile_text(report.get("compile"))))
    parts.append(_findings(report))
    parts.append(workers_html(report.get("findings") or []))
    parts.append(_captures(report["captures"]))
    parts.append(_lines_section("budgets", budget_lines(report)))
    parts.append(_operators(report["top_operators"]))
    if report["problems"]:
        items = "".join(f"<li><code>{_e(p['file'])}</code>: {_e(p['error'])}</li>"
                        for p in report["problems"])
        parts.append(f"<h2>Files that could not be read</h2><ul class=problems>{items}</ul>")
    return visible("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">"
            f"<title>profcallbacks report: {_e(report['logdir'])}</title><style>{_CSS}</style></head>"
            "<body>\n" + "\n".join(parts) + "\n</body></html>\n")  # bidi overrides shown, not obeyed


def _verdict_panel(report: dict[str, Any]) -> str:
    """What bounds the run, with evidence and advice, then each capture's verdict and GPU shares."""
    verdict = report.get("verdict")
    rows = []
    for c in report["captures"]:
        v = c.get("verdict") or {}
        shares = [f["gpu_breakdown"] for f in c["files"] if f.get("gpu_breakdown")]
        gpu = "; ".join(f"idle {_pct(g['idle_share'])}, compute {_pct(g['compute_share'])}, "
                        f"non-compute {_pct(g['non_compute_share'])}, comm overlap "
                        f"{_pct(g['comm_overlap_share'])}" for g in shares) or "-"
        rows.append([f"<code>{_e(c['directory'])}</code>", _e(c["trigger"] or "-"),
                     _e(label(v) if v else "-"), _pct(v.get("share")), _e(gpu)])
    table = _table(["capture", "trigger", "verdict", "share", "GPU breakdown"], rows, {3}) \
        if len(rows) > 1 or any(r[4] != "-" for r in rows) else ""
    if not verdict:  # the GPU shares of the captures still show
        read = sum(1 for c in report["captures"] for f in c["files"] if f.get("readable"))
        why = (f"{read} trace(s) read, none with steps or operators it understands (see the "
               "problems below)") if read else "no trace could be read"
        return f"<div class=verdict id=verdict><h2>Verdict</h2><p>None: {_e(why)}.</p>{table}</div>"
    evidence = "".join(f"<li>{_e(line)}</li>" for line in verdict["evidence"])
    advice = "".join(f"<li class=advice>{_e(line)}</li>" for line in verdict["advice"])
    close = f" / {_e(verdict['close_to'].replace('_', ' '))} (close)" if verdict.get("close_to") else ""
    return (f"<div class=verdict id=verdict data-kind=\"{_e(verdict['kind'])}\"><h2>Verdict: "
            f"{_e(verdict['kind'].replace('_', ' '))}{close} ({_pct(verdict['share'])})</h2>"
            f"<ul>{evidence}</ul><p>Try:</p><ul>{advice}</ul>{table}</div>")


def _ranks(steps: dict[str, Any]) -> str:
    if len(steps["per_rank"]) < 2:
        return ""
    stragglers = {s["rank"]: s["reason"] for s in steps["stragglers"]}
    rows = [[_e(r["rank"]), _e(r["steps"]), _ms(r["mean_ms"]), _ms(r["max_ms"]), _ms(r["data_wait_ms"]),
             _pct(r["data_wait_share"]), _e(stragglers.get(r["rank"], ""))] for r in steps["per_rank"]]
    return (f"<h2>Ranks</h2><p>Slowest rank: <b>{_e(steps['slowest_rank'])}</b>; data-wait share spread "
            f"(max - min): {_pct(steps['data_wait_share_spread'])}.</p>"
            + _table(["rank", "steps", "mean", "max", "data wait", "wait share", "straggler"], rows,
                     {1, 2, 3, 4, 5}))


def _breakdown(bd: dict[str, Any] | None) -> str:
    if bd is None:
        return "<h2>Breakdown</h2><p>No traced steps.</p>"
    bar = "".join(f'<div class="part-{k}" style="width:{max(bd[k + "_share"], 0) * 100:.2f}%;'
                  f'background:{c}" title="{k}: {_pct(bd[k + "_share"])}"></div>'
                  for k, c in _BREAKDOWN_COLOURS.items())
    rows = [[f'<i style="display:inline-block;width:10px;height:10px;background:{c}"></i> '
             f'{k.replace("_", " ")}', _ms(bd[k + "_ms"]), _pct(bd[k + "_share"])]
            for k, c in _BREAKDOWN_COLOURS.items()]
    if bd["gpu_kernel_ms"] is not None:
        rows.append(["GPU kernels busy", _ms(bd["gpu_kernel_ms"]), ""])
    return (f"<h2>Breakdown of the traced steps</h2><p>Mean of {bd['steps']} <code>ProfilerStep</code> "
            f"ranges (all ranks), {_ms(bd['step_ms'])} per step. Data wait: dataloader events; compute: "
            "outermost CPU operators; other: the rest of the step.</p>"
            f"<div class=bar id=breakdown>{bar}</div>"
            + _table(["part", "per step", "share"], rows, {1, 2}))


def _findings(report: dict[str, Any]) -> str:
    groups = report["findings_by_kind"]
    if not groups:
        return "<h2>Findings</h2><p id=findings>No findings.</p>"
    out = ["<h2>Findings</h2><div id=findings>"]
    for g in groups:
        items = [f for f in report["findings"] if str(f["kind"]) == g["kind"]]
        rows = [[_e(f["step"]), _e(f["rank"]), f'<span class="sev-{_e(f["severity"])}">{_e(f["severity"])}'
                 f"</span>", _e(without_advice(str(f["message"]))),
                 _details(f["details"])] for f in items]
        advice = ("<p class=advice>Advice: as in the verdict above</p>" if g.get("advice_in_verdict")
                  else f'<p class=advice>Advice: {_e(g["advice"])}</p>' if g["advice"] else "")
        out.append(f'<div class="finding" data-kind="{_e(g["kind"])}"><h3>{_e(g["kind"])} '
                   f'<span class="sev-{_e(g["severity"])}">{_e(g["severity"])}</span> '
                   f'&times;{g["count"]}</h3>'
                   f"{advice}" + _table(["step", "rank", "severity", "message", ""], rows, {0, 1}) + "</div>")
    return "".join(out) + "</div>"


def _details(details: dict[str, Any]) -> str:
    if not details:
        return ""
    text = _e(json.dumps(details, indent=1, default=str))
    return f"<details><summary>details</summary><pre>{text}</pre></details>"


def _captures(captures: list[dict[str, Any]]) -> str:
    if not captures:
        return "<h2>Captures</h2><p>No captures.</p>"
    rows = [[f"<code>{_e(c['directory'])}</code>",
             _e(c["trigger"] or "-") + (" (partial)" if c["partial"] else "")
             + (" (during an export)" if c.get("export_overlap") else ""),
             _e(f"{c['steps'][0]}-{c['steps'][-1]}" if c["steps"] else "-"),
             "<br>".join(f"<code>{_e(f['path'])}</code> ({f['bytes'] / 1024:.0f} KiB)"
                         for f in c["files"][:LISTED_FILES])
             + (f"<br>and {len(c['files']) - LISTED_FILES} more" if len(c["files"]) > LISTED_FILES
                else "")]
            for c in captures]
    jobs = [line for c in captures for line in job_lines(c["directory"], c.get("job"))]
    return ("<h2>Captures</h2>" + _table(["directory", "trigger", "steps", "files"], rows)
            + (f"<pre>{_e(chr(10).join(jobs))}</pre>" if jobs else ""))


def _lines_section(section_id: str, lines: list[str]) -> str:
    """A section of the text report (a heading, then lines indented by two spaces per level) as
    HTML, so the page and the text say the same."""
    lines = [line for line in lines if line.strip()]
    if not lines:
        return ""
    items = "".join(f"<li class=l{min(3, (len(line) - len(line.lstrip(' '))) // 2)}>"
                    f"{_e(line.strip())}</li>" for line in lines[1:])
    return f"<h2 id={section_id}>{_e(lines[0])}</h2><ul class=lines>{items}</ul>"


def _operators(ops: dict[str, list[dict[str, Any]]]) -> str:
    out = []
    for key, title in (("cpu", "Top CPU operators by self time"), ("gpu", "Top GPU kernels by time")):
        if ops[key]:
            rows = [[f"<code>{_e(o['name'])}</code>", _e(o["calls"]), _ms(o["self_ms"]),
                     _ms(o["self_ms_per_step"])] for o in ops[key]]
            out.append(f"<h2>{title}</h2>"
                       + _table(["operator", "calls", "self", "per step"], rows, {1, 2, 3}))
    return "".join(out)
