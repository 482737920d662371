"""``profcallbacks report DIR`` on a directory of several runs: one headline per run."""

from __future__ import annotations

import os
from typing import Any

from profcallbacks.report.build import build_report
from profcallbacks.report.read.logdir import RunFiles
from profcallbacks.report.render.safe import visible


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """Steps, median step time (ms), verdict kind, findings and captures of one report."""
    steps = report["steps"] or {}
    verdict = report.get("verdict")
    return {"logdir": report["logdir"], "steps": steps.get("steps"), "median_ms": steps.get("median_ms"),
            "data_wait_share": steps.get("data_wait_share"),
            "verdict": verdict.get("kind") if isinstance(verdict, dict) else None,
            "findings": len(report["findings"]), "captures": len(report["captures"]),
            "problems": len(report["problems"])}


def run_headlines(runs: list[RunFiles]) -> list[dict[str, Any]]:
    """The headline of each run, in the order given."""
    return [headline(build_report(run, top=1)) for run in runs]


def render_runs_text(root: str, rows: list[dict[str, Any]]) -> str:
    """The headlines as a text table (runs named relative to ``root``, made visible: a run's name
    is whoever made its directory's choice), with what to run next."""
    out = [f"profcallbacks: {visible(root)} holds {len(rows)} runs", "",
           f"  {'run':<44} {'steps':>7} {'median ms':>10} {'data wait':>9} {'verdict':<20} "
           f"{'captures':>8} {'findings':>8}"]
    for r in rows:
        name = visible(os.path.relpath(r["logdir"], root))
        name = name if len(name) <= 44 else "..." + name[-41:]
        median = "-" if r["median_ms"] is None else f"{r['median_ms']:.2f}"
        share = "-" if r["data_wait_share"] is None else f"{r['data_wait_share']:.0%}"
        steps = "-" if r["steps"] is None else str(r["steps"])
        out.append(f"  {name:<44} {steps:>7} {median:>10} {share:>9} {r['verdict'] or '-':<20} "
                   f"{r['captures']:>8} {r['findings']:>8}")
    out += ["", "Report one run with `profcallbacks report RUN`, compare two with "
                "`profcallbacks compare RUN_A RUN_B`."]
    return "\n".join(out) + "\n"
