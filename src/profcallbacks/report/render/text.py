"""The report as terminal text."""

from __future__ import annotations

import textwrap
from typing import Any

from profcallbacks.report.analyse.compile import compile_text
from profcallbacks.report.analyse.fmt import ms as _ms
from profcallbacks.report.analyse.fmt import pct as _pct
from profcallbacks.report.analyse.fmt import steps as _steps
from profcallbacks.report.analyse.memory import memory_text
from profcallbacks.report.analyse.verdict import SHARE_OF
from profcallbacks.report.analyse.verdict import label as verdict_label
from profcallbacks.report.read.budgets import budget_lines
from profcallbacks.report.render.expert_render import diagnosis_lines, throughput_text
from profcallbacks.report.render.ranks_text import file_list, job_lines
from profcallbacks.report.render.safe import visible
from profcallbacks.report.render.workers_render import workers_text


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line, indent + "  ".join("-" * w for w in widths)]
    out += [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def _cut(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text, section by section."""
    out = [f"profcallbacks report: {report['logdir']}",
           f"ranks: {', '.join(str(r) for r in report['ranks']) or '-'} "
           f"(world size {report['world_size']})", ""]
    read = [f for c in report["captures"] for f in c["files"] if f.get("readable")]
    out += _verdict_lines(report.get("verdict"), "Verdict", read) + diagnosis_lines(
        report.get("diagnoses"), said=(report.get("verdict") or {}).get("advice"))
    earlier = report.get("earlier_runs") or []
    if earlier:
        runs = "; ".join(
            f"run {r['run']}: steps {r['first_step']}-{r['last_step']}, {r['findings']} finding(s)"
            + (f", captures {', '.join(r['captures'])}" if r["captures"] else "") for r in earlier)
        out += textwrap.wrap(f"This log directory holds the files of {len(earlier) + 1} runs (a "
                             f"restart into it): {runs}. What follows is run {len(earlier) + 1}, "
                             "the latest; the earlier runs' steps and findings are not merged "
                             "into it.", 100) + [""]
    if report.get("foreign"):
        out += ["Traces not written by profcallbacks: no step summaries or findings files; what "
                "follows is read from the traces alone", ""]
    else:
        out += _steps_section(report["steps"])
    out += _breakdown_section(report["breakdown"], bool(report.get("foreign")))
    out += _captures_section(report["captures"], earlier)
    out += budget_lines(report)
    out += _operators_section(report["top_operators"], read)
    out += memory_text(report.get("memory"))
    out += compile_text(report.get("compile"))
    out += _findings_section(report["findings_by_kind"])
    out += workers_text(report.get("findings") or [])
    if report["problems"]:
        out.append("Files that could not be read")
        out += [f"  {p['file']}: {p['error']}" for p in report["problems"]]
        out.append("")
    return visible("\n".join(out).rstrip() + "\n")  # no raw escape sequences reach a terminal


def step_spread(steps: dict[str, Any]) -> str:
    """Mean, percentiles, max and its step; how many steps the capture windows took out."""
    if steps.get("p90_ms") is None:  # a steps file of an older version
        return (f"mean {_ms(steps['mean_ms'])}   median {_ms(steps['median_ms'])} (of interval "
                f"medians)   max {_ms(steps['max_ms'])}")
    return (f"mean {_ms(steps['mean_ms'])}   p50 {_ms(steps['median_ms'])}   p90 "
            f"{_ms(steps['p90_ms'])}   p99 {_ms(steps['p99_ms'])}   max {_ms(steps['max_ms'])} "
            f"(step {steps['max_step']})   {steps['steps_per_s']:.1f} steps/s; "
            f"{steps['steps_excluded']} steps in capture windows, audits or compiling left out")


def _steps_section(steps: dict[str, Any] | None) -> list[str]:
    out = ["Step time (whole run, from profcallbacks/rank*.steps.jsonl)"]
    if steps is None:
        return out + ["  no step summaries (the run wrote no steps file, or ended before "
                      "log_every_n_steps steps)", ""]
    out += [f"  steps {steps['first_step']}-{steps['last_step']} ({steps['steps']} steps)",
            f"  {step_spread(steps)}",
            f"  data wait {_ms(steps['data_wait_ms'])} per step ({_pct(steps['data_wait_share'])}); "
            f"the rest ({_pct(1 - steps['data_wait_share'])}) is compute and other work", ""]
    if len(steps["per_rank"]) > 1:
        out.append("Per rank")
        rows = [[str(r["rank"]), str(r["steps"]), _ms(r["mean_ms"]), _ms(r["max_ms"]),
                 _ms(r["data_wait_ms"]), _pct(r["data_wait_share"])] for r in steps["per_rank"]]
        out += _table(["rank", "steps", "mean", "max", "data wait", "wait share"], rows)
        out.append(f"  slowest rank: {steps['slowest_rank']}; data-wait share spread "
                   f"(max - min): {_pct(steps['data_wait_share_spread'])}")
        if steps["stragglers"]:
            out += [f"  straggler: rank {s['rank']}: {s['reason']}" for s in steps["stragglers"]]
        else:
            out.append("  stragglers: none")
        out.append("")
    return out


def _breakdown_section(bd: dict[str, Any] | None, foreign: bool = False) -> list[str]:
    if bd is None and foreign:
        return []  # traces without ProfilerStep ranges: the captures below say what they hold
    out = ["Breakdown of the traced steps (mean per ProfilerStep range, healthy captures: not "
           "slowdown ones)"]
    if bd is None:
        return out + ["  no traced steps", ""]
    out.append(f"  {bd['steps']} traced steps (all ranks), step {_ms(bd['step_ms'])}")
    for key, label in (("data_wait", "data wait"), ("compute", "compute (CPU ops)"),
                       ("other", "other")):
        out.append(f"  {label:<18} {_ms(bd[key + '_ms']):>12}  {_pct(bd[key + '_share']):>6}")
    if bd.get("compiled_ms"):
        out.append(f"  {'torch.compile code':<18} {_ms(bd['compiled_ms']):>12}  "
                   f"{_pct(bd['compiled_share']):>6}  (compiled regions, part of the above)")
    if bd["gpu_kernel_ms"] is not None:
        out.append(f"  {'GPU kernels busy':<18} {_ms(bd['gpu_kernel_ms']):>12}")
    return out + [""]


def _captures_section(captures: list[dict[str, Any]],
                      report_runs: list[dict[str, Any]] | None = None) -> list[str]:
    report_runs = report_runs or []
    out = ["Captures"]
    if not captures:
        return out + ["  none", ""]
    rows = []
    for c in captures:
        steps = f"{c['steps'][0]}-{c['steps'][-1]}" if c["steps"] else "-"
        files = file_list([f["path"].split("/")[-1] for f in c["files"]])
        kind = verdict_label(c["verdict"]) if c.get("verdict") else "-"
        earlier_run = c.get("run") not in (None, len(report_runs) + 1)
        rows.append([c["directory"], (c["trigger"] or "-") + (" (partial)" if c["partial"] else "")
                     + (f" (run {c['run']})" if earlier_run else "")
                     + (" (during an export)" if c.get("export_overlap") else ""), steps, kind, files])
    out += _table(["directory", "trigger", "steps", "verdict", "files"], rows) + [""]
    for c in captures:
        for f in c["files"]:
            fmt = f.get("trace_format") or {}
            if fmt and (fmt["generation"] != "torch 2.x" or not fmt["steps"]):
                out.append(f"  format {f['path']}: {fmt['generation']}, {fmt['cpu_ops']} CPU "
                           f"operators, {fmt['steps']} ProfilerStep ranges, {fmt['loader_ranges']} "
                           f"DataLoader ranges, {fmt['device_events']} GPU events")
            gb = f.get("gpu_breakdown")
            if gb:
                overlap = gb["comm_overlap_share"]
                out.append(f"  GPU {f['path']}: idle {_pct(gb['idle_share'])}, compute "
                           f"{_pct(gb['compute_share'])}, non-compute {_pct(gb['non_compute_share'])}"
                           f", comm overlap {_pct(overlap)}")
        line = throughput_text(c.get("throughput"))
        if line:
            out.append(f"  {c['directory']}: {line}")
        if c.get("ranks_differ"):
            out.append(f"  {c['directory']}: ranks differ: {c['ranks_differ']}")
        out += job_lines(c["directory"], c.get("job"))
        bd = c.get("breakdown")
        if len(captures) > 1 and bd:
            out.append(f"  {c['directory']}: step {_ms(bd['step_ms'])}, data wait "
                       f"{_pct(bd['data_wait_share'])}, compute {_pct(bd['compute_share'])}, other "
                       f"{_pct(bd['other_share'])}")
        if len(captures) > 1 and c.get("verdict"):
            out += _verdict_lines(c["verdict"], f"  {c['directory']}")
    return out + ([""] if out[-1] else [])


def _verdict_lines(verdict: dict[str, Any] | None, title: str,
                   read: list[dict[str, Any]] | None = None) -> list[str]:
    """The verdict in one line, then its evidence and advice."""
    if not verdict:
        if read is None:
            return [f"{title}: none (no traced steps)", ""]
        if not read:
            return [f"{title}: none (no trace could be read)", ""]
        return [f"{title}: none ({len(read)} trace(s) read, none with steps or operators it "
                "understands: see the formats and problems below)", ""]
    indent = " " * (len(title) - len(title.lstrip()) + 2)
    basis = verdict.get("share_of") or SHARE_OF.get(verdict["kind"], "step")
    head = verdict_label(verdict)
    out = [f"{title}: {head.replace(verdict['kind'], verdict['kind'].upper(), 1)} "
           f"({verdict['share']:.0%} of the {basis})"
           + (" (kept from the run's earlier captures)" if verdict.get("held") else "")]
    for line in verdict["evidence"]:
        out += textwrap.wrap(line, 100, initial_indent=indent + "- ",
                             subsequent_indent=indent + "  ")
    for line in verdict["advice"]:
        out += textwrap.wrap(line, 100, initial_indent=indent + "try: ",
                             subsequent_indent=indent + "     ")
    return out + [""]


def _operators_section(ops: dict[str, list[dict[str, Any]]],
                       read: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for key, title in (("cpu", "Top CPU operators by self time"), ("gpu", "Top GPU kernels by time")):
        if not ops[key]:
            continue
        rows = [[_cut(o["name"]), str(o["calls"]), _ms(o["self_ms"]), _ms(o["self_ms_per_step"])]
                for o in ops[key]]
        out += [title] + _table(["operator", "calls", "self", "per step"], rows) + [""]
    if out:
        return out
    if not read:
        return ["Top operators", "  no trace could be read", ""]
    return ["Top operators", f"  none: {len(read)} trace(s) read, holding no CPU operator or GPU "
            "kernel the report understands (see below)", ""]


def _findings_section(groups: list[dict[str, Any]]) -> list[str]:
    out = ["Findings"]
    if not groups:
        return out + ["  none", ""]
    for g in groups:
        ranks = ", ".join(str(r) for r in g["ranks"])
        out.append(f"  {g['kind']} ({g['severity']}): {g['count']} finding(s), "
                   f"{_steps(g['first_step'], g['last_step'])}, "
                   f"rank(s) {ranks}")
        for message in g["messages"]:
            out += textwrap.wrap(message, 100, initial_indent="    - ", subsequent_indent="      ")
        if g.get("advice_in_verdict"):
            out.append("    advice: as in the verdict above")
        elif g["advice"]:
            out += textwrap.wrap(g["advice"], 100, initial_indent="    advice: ",
                                 subsequent_indent="      ")
    return out + [""]
