"""Builds the report of one run: a plain dict with the schema of docs/reference/report-schema.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profcallbacks._version import __version__
from profcallbacks.findings import CAPTURE_VERDICT, SYNC_POINT
from profcallbacks.report.analyse.advice import RunContext, finding_advice, run_context, without_advice
from profcallbacks.report.analyse.captures import (
    UNHEALTHY_TRIGGERS,
    public_metrics,
    rank_verdicts,
    run_verdict,
)
from profcallbacks.report.analyse.compile import compile_diagnoses, compile_report
from profcallbacks.report.analyse.coverage import slower_than_captured
from profcallbacks.report.analyse.expert import fit_to_run, pool_diagnoses, with_peak
from profcallbacks.report.analyse.memory import memory_report
from profcallbacks.report.analyse.metrics_fold import CaptureFold
from profcallbacks.report.analyse.ranks import DETAIL_UP_TO, detail_ranks, job_view
from profcallbacks.report.analyse.stats import clean_intervals, step_stats
from profcallbacks.report.analyse.trace_fold import RunTraces, StepSums
from profcallbacks.report.analyse.verdict import WAITING_KINDS, with_stragglers
from profcallbacks.report.read.budgets import capture_budget, merged_trace, removed_captures
from profcallbacks.report.read.files import ReadError, read_jsonl, why_not_a_trace
from profcallbacks.report.read.files import as_int as _int
from profcallbacks.report.read.logdir import RunFiles, find_runs, foreign_run
from profcallbacks.report.read.restarts import split_runs
from profcallbacks.report.read.summaries import SummaryUse
from profcallbacks.report.summarize import detail_rows, pooled_part
from profcallbacks.report.trace_reads import TraceReads

SCHEMA_VERSION = 3
FINDING_KEYS = ("kind", "step", "rank", "severity", "message", "details")
_SEVERITY_ORDER = {"info": 0, "warning": 1, "error": 2}

class NoRunError(Exception):
    """The path holds no readable run; ``str()`` says why."""


def locate_run(path: Path) -> RunFiles:
    """The one run at or below ``path``: a profcallbacks log directory, or foreign traces.

    Foreign traces: a directory holding Chrome-format torch.profiler traces (one capture per
    directory that holds them) or a single trace file.

    Raises:
        NoRunError: ``path`` does not exist, holds no run, or holds several.
    """
    if not path.exists():
        raise NoRunError(f"{path}: no such file or directory")
    try:
        runs = find_runs(path) if path.is_dir() else []
    except OSError as exc:
        raise NoRunError(f"{path}: cannot read it ({exc.strerror or exc}); run the report as a user "
                         "who may read the log directory") from None
    if not runs:
        foreign = foreign_run(path)
        if foreign is not None:
            return foreign
        if not path.is_dir():
            raise NoRunError(f"{path}: {why_not_a_trace(path)}")
        raise NoRunError(f"{path}: no profcallbacks run here and no torch.profiler traces (no "
                         "capture directories such as step000120-schedule/, no "
                         "profcallbacks/rank*.jsonl files, no *.json(.gz) traces)")
    if len(runs) > 1:
        names = ", ".join(str(r.root) for r in runs[:6]) + (" ..." if len(runs) > 6 else "")
        raise NoRunError(f"{path}: holds {len(runs)} runs ({names}); report one of them, or "
                         "compare two with `profcallbacks compare`")
    return runs[0]


def build_report(run: RunFiles, *, top: int = 15, peak_tflops: float | None = None,
                 summaries: bool = True, processes: int | None = 1) -> dict[str, Any]:
    """Reads every file of ``run`` and returns the report (see docs/reference/report-schema.md).

    ``peak_tflops``: the device's dense peak for MFU, for devices the built-in table lacks.
    ``summaries``: read each trace's summary where it still matches (False: parse every trace).
    ``processes``: processes parsing traces at once (``trace_reads.TraceReads``): 1 (file by
    file, here), ``None`` (up to the usable cores where that pays: the command line's default) or
    N; the report is the same. Worker processes import the caller's main module, as
    ``multiprocessing`` does: a script that asks for them needs ``if __name__ == "__main__":``.
    """
    use = SummaryUse()
    problems: list[dict[str, str]] = list(run.problems)
    interval_rows = [row for path in run.steps_files.values() for row in read_jsonl(path, problems)]
    split = split_runs(interval_rows, _read_findings(run, problems))  # a restarted run: the latest
    interval_rows = split.rows
    findings = sorted(({k: v for k, v in f.items() if k != "run"} for f in split.findings),
                      key=lambda f: (_int(f["step"]), _int(f["rank"])))  # as Finding.to_dict()
    traces = RunTraces()  # every trace folded in as read: thousands of ranks, running totals
    captures: list[dict[str, Any]] = []
    file_folds: list[tuple[CaptureFold, list[dict[str, Any]]]] = []  # per capture: pooled, votes
    file_rows: list[list[dict[str, Any]]] = []  # per capture: its ranks' rows (job_view)
    sync_sites = list(dict.fromkeys(str(f["details"].get("location")) for f in findings
                                    if f["kind"] == SYNC_POINT and f["details"].get("location")))
    # each trace parsed once, in order; the next ones ahead in worker processes where that pays
    with TraceReads([p for c in run.captures for p in c.files], summaries=summaries,
                    processes=processes) as reads:
        for capture in run.captures:
            files: list[dict[str, Any]] = []
            rank_rows: list[dict[str, Any]] = []
            fold = CaptureFold()  # its files' analyses pooled as read: the verdict is made below
            votes: list[dict[str, Any]] = []  # each rank's own verdict
            run_number = split.capture_run.get(capture.directory.name, split.runs)
            healthy, earlier = capture.trigger not in UNHEALTHY_TRIGGERS, run_number != split.runs
            steps_of = StepSums()
            many = len(capture.files) > DETAIL_UP_TO  # per-step rows later, for stand-out ranks only
            for path in capture.files:
                entry: dict[str, Any] = {"path": str(path.relative_to(run.root)), "bytes": _size(path)}
                try:
                    summary, row = reads.next(path, use)
                except ReadError as exc:
                    problems.append({"file": str(path), "error": exc.reason})
                    entry.update(rank=None, worker=path.name.split(".")[0], steps=[], readable=False,
                                 gpu_breakdown=None, source="trace")
                else:
                    entry["source"] = row["source"]
                    rank_rows.append(dict(row, entry=len(files)))
                    traces.add(summary, healthy=healthy, earlier=earlier)
                    steps_of.add(summary, keep=not many)
                    if summary.bad_events:
                        problems.append({"file": str(path), "error": f"skipped {summary.bad_events} "
                                         f"malformed event(s), e.g. {summary.bad_example}"})
                    not_understood = summary.format.problem()
                    if not_understood:
                        problems.append({"file": str(path), "error": not_understood})
                    analysis = summary.analysis or {}
                    problems += [{"file": str(path), "error": p} for p in analysis.get("problems", [])
                                 if not (summary.bad_events and p.startswith("skipped"))]  # said above
                    if analysis and not not_understood:  # no verdict from operators it cannot see
                        part = pooled_part(analysis, summary.rank)
                        fold.add(part)  # a rank's kind, share and close call do not need the run's
                        votes += rank_verdicts([part], sync_sites)  # context (it words the advice)
                    entry.update(rank=summary.rank, worker=summary.worker,
                                 steps=[s["step"] for s in summary.steps], readable=True,
                                 gpu_breakdown=analysis.get("gpu_breakdown"),
                                 host_steps=None if many else analysis.get("host", {}).get("per_step", []),
                                 export_overlap=summary.export_overlap,
                                 trace_format=summary.format.public(), budget=summary.budget)
                    del summary, analysis
                files.append(entry)
            if not capture.files:
                problems.append({"file": str(capture.directory), "error": "capture directory with no trace"})
            steps = sorted({s for f in files for s in f["steps"]})
            captures.append({"directory": capture.directory.name, "trigger": capture.trigger,
                             "run": run_number,
                             "first_step": capture.first_step, "steps": steps,
                             "partial": capture.partial, "files": files,
                             "breakdown": steps_of.result(),
                             "export_overlap": any(f.get("export_overlap") for f in files),
                             "budget": capture_budget(files),
                             "merged": merged_trace(capture.merged, run.root) if capture.merged
                             else None})
            file_folds.append((fold, votes))
            file_rows.append(rank_rows)
    context = run_context(traces.formats(), findings, traces.names, max(1, traces.world_size))
    previous: str | None = None
    for c, (fold, votes), rows in zip(captures, file_folds, file_rows, strict=True):
        pooled = fold.result(sync_sites, context=context, previous=previous)
        c["verdict"], c["metrics"] = pooled["verdict"], pooled["metrics"]
        c["diagnoses"] = fit_to_run(_with_sites(pooled["diagnoses"], sync_sites), context)
        c["throughput"] = with_peak(pooled["throughput"], peak_tflops)
        c["rank_verdicts"] = votes
        c["job"] = job_view(rows, c["rank_verdicts"])
        c["ranks_differ"] = ranks_differ(c["rank_verdicts"], [s["rank"] for s in (
            c["job"] or {}).get("stragglers", [])])
        c["verdict"] = with_stragglers(c["verdict"], c["job"])
        _keep_detail(c, rows, use_summaries=summaries)
        if c["verdict"] and c["trigger"] not in UNHEALTHY_TRIGGERS:
            previous = c["verdict"]["kind"]
    latest = [c for c in captures if c["run"] == split.runs]
    verdict = run_verdict(latest, sync_sites, context=context)
    verdict = with_stragglers(verdict, latest[-1]["job"] if latest else None)
    chosen = [c for c in latest if c["trigger"] not in UNHEALTHY_TRIGGERS] or latest
    run_diagnoses = pool_diagnoses([(c["directory"], c["diagnoses"]) for c in chosen])
    for c in captures:
        c["metrics"] = public_metrics(c["metrics"])
    intervals = clean_intervals(interval_rows)
    far = slower_than_captured(latest, intervals) if verdict is not None else None
    if verdict is not None and far is not None:  # the verdict says what it describes
        verdict = dict(verdict, evidence=[far["message"], *verdict["evidence"]],
                       slower_than_captured=far)
    ranks = sorted({r["rank"] for r in intervals} | traces.ranks
                   | {_int(f["rank"]) for f in findings} | set(run.steps_files) | set(run.findings_files))
    world_size = max(len(ranks), traces.world_size)
    run_steps = step_stats(intervals)
    compiled = compile_report(interval_rows, findings)
    run_diagnoses = sorted(run_diagnoses + compile_diagnoses(compiled, run_steps),
                           key=lambda d: -d["gain_ms"])
    foreign = not (run.steps_files or run.findings_files) and all(c.trigger is None
                                                                  for c in run.captures)
    return {
        "schema_version": SCHEMA_VERSION,
        "foreign": foreign,
        "generator": f"profcallbacks {__version__}",
        "logdir": str(run.root),
        "world_size": world_size,
        "ranks": ranks,
        "steps": run_steps,
        "verdict": verdict,
        "diagnoses": run_diagnoses,
        "run_context": context.public(),
        "earlier_runs": split.earlier,
        "breakdown": traces.breakdown(_run_steps(captures, *traces.chosen(), split.runs)),
        "captures": captures,
        "top_operators": traces.top_operators(top),
        "findings": findings,
        "findings_by_kind": group_findings(findings, context, verdict),
        "memory": memory_report(interval_rows, findings),
        "removed_captures": removed_captures(run.root, problems),
        "compile": compiled,
        "problems": problems,
        "summaries": use.public(),
        "readable": bool(intervals or findings or traces.count),
    }


def _keep_detail(capture: dict[str, Any], rows: list[dict[str, Any]], *,
                 use_summaries: bool) -> None:
    """A capture of many ranks keeps per-step rows only for the ranks that stand out: read again
    (their summaries; their traces where a summary is missing or not used) once the job view has
    named them."""
    if len(capture["files"]) <= DETAIL_UP_TO:
        return
    again = detail_rows(rows, detail_ranks(capture["job"]), summaries=use_summaries)
    kept = {index: host_steps for index, _, host_steps in again}
    for index, f in enumerate(capture["files"]):
        if "host_steps" in f:  # set in its place (the report's keys keep their order)
            if index in kept:
                f["host_steps"] = kept[index]
            else:
                f.pop("host_steps")
    if capture["breakdown"]:
        capture["breakdown"]["per_step"] = [s for _, steps, _ in again for s in steps]


def _run_steps(captures: list[dict[str, Any]], healthy: bool, latest: bool,
               runs: int) -> list[dict[str, Any]]:
    """The per-step rows of the run's breakdown: those its captures kept, of the captures it
    is made of (``RunTraces.chosen``)."""
    return [dict(s) for c in captures if c["breakdown"]
            and (not healthy or c["trigger"] not in UNHEALTHY_TRIGGERS)
            and (not latest or c["run"] == runs) for s in c["breakdown"]["per_step"]]


def _with_sites(diagnoses: list[dict[str, Any]], sync_sites: list[str]) -> list[dict[str, Any]]:
    """The run's own sync findings name the user's line of a ``sync_in_step`` diagnosis."""
    if not sync_sites:
        return diagnoses
    return [dict(d, where=", ".join(sync_sites[:3])) if d["kind"] == "sync_in_step" else d
            for d in diagnoses]


def _read_findings(run: RunFiles, problems: list[dict[str, str]]) -> list[dict[str, Any]]:
    findings = []
    for path in run.findings_files.values():
        for row in read_jsonl(path, problems):
            if not all(k in row for k in FINDING_KEYS[:5]):
                problems.append({"file": str(path), "error": "skipped a finding without "
                                 + "/".join(k for k in FINDING_KEYS[:5] if k not in row)})
                continue
            details = row.get("details")
            findings.append({k: row[k] for k in FINDING_KEYS[:5]}
                            | {"details": details if isinstance(details, dict) else {}}
                            | ({"run": str(row["run"])} if row.get("run") else {}))
    return findings  # in file order: report/read/restarts.py numbers the runs by it


def group_findings(findings: list[dict[str, Any]], context: RunContext | None = None,
                   verdict: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One entry per kind: count, worst severity, ranks, step range, messages and advice.

    A finding's own advice (``details["advice"]``) is the group's advice and is cut from its
    messages (it is shown once); ``advice_in_verdict`` says the verdict gives that same advice.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for finding in findings:
        groups.setdefault(str(finding["kind"]), []).append(finding)
    out: list[dict[str, Any]] = []
    shown = " ".join(verdict.get("advice", [])) if verdict else ""
    for kind, items in groups.items():
        severity = max((str(f["severity"]) for f in items), key=lambda s: _SEVERITY_ORDER.get(s, -1))
        advice = next((a for a in map(_advice, items) if a), None) or finding_advice(kind, context)
        messages = list(dict.fromkeys(without_advice(str(f["message"])) for f in items))
        out.append({"kind": kind, "count": len(items), "severity": severity,
                    "ranks": sorted({_int(f["rank"]) for f in items}),
                    "first_step": min(_int(f["step"]) for f in items),
                    "last_step": max(_int(f["step"]) for f in items),
                    "messages": messages[:5], "advice": advice,
                    "advice_in_verdict": _same_advice(advice, shown) or (
                        kind == CAPTURE_VERDICT and verdict is not None
                        and any(f["details"].get("kind") == verdict["kind"] for f in items))})
    out.sort(key=lambda g: (-_SEVERITY_ORDER.get(g["severity"], -1), -g["count"], g["kind"]))
    return out


def _same_advice(advice: str | None, shown: str) -> bool:
    return bool(advice and shown) and str(advice).rstrip(". ").split(";")[0].strip() in shown


def ranks_differ(verdicts: list[dict[str, Any]],
                 waiting_for: list[int] | None = None) -> str | None:
    """Which rank got another verdict than the others in one capture, and why; ``None`` if none.

    Ranks whose kinds differ only by a close call (one's kind is the other's ``close_to``) do the
    same work within the verdict's margin: the sentence says so. Ranks bound by waiting
    (``WAITING_KINDS``) in a capture with stragglers (``waiting_for``, not among them) wait for
    those: the sentence names them.
    """
    kinds = [v["kind"] for v in verdicts]
    if len(set(kinds)) <= 1:
        return None
    usual = max(kinds, key=kinds.count)
    odd = [v for v in verdicts if v["kind"] != usual]
    close = all(v["close_to"] == usual for v in odd) or all(
        u["close_to"] in {v["kind"] for v in odd} for u in verdicts if u["kind"] == usual)
    ranks = ", ".join(f"rank {v['rank']} {v['kind']} ({v['share']:.0%})" for v in odd)
    if close:
        return f"{ranks} against {usual} on the others: a close call within the margin, same work"
    if waiting_for and all(v["kind"] in WAITING_KINDS for v in odd) and not (
            {v["rank"] for v in odd} & set(waiting_for)):
        late = ", ".join(map(str, waiting_for[:8])) + (" ..." if len(waiting_for) > 8 else "")
        return (f"{ranks} against {usual} on the others: they wait in the collectives for the "
                f"straggler rank{'s' if len(waiting_for) > 1 else ''} {late}, which arrive late")
    return (f"{ranks} against {usual} on the others: that rank spends its step differently "
            "(see its numbers in the capture's files)")


def _advice(finding: dict[str, Any]) -> str | None:
    """The finding's own advice (``details["advice"]``, a string or a list of strings)."""
    advice = finding["details"].get("advice")
    if isinstance(advice, str) and advice:
        return advice
    if isinstance(advice, list) and advice:
        return "; ".join(str(a).rstrip(". ") for a in advice) + "."
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
