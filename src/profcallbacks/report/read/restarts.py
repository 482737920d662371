"""Several runs in one log directory: which rows, findings and captures belong to which run.

Each steps-file row and finding carries the id of the run that wrote it (``"run"``,
``layout.new_run_id``). Ids differ between ranks when the launcher gives none, so runs are
numbered per rank by order of appearance in that rank's files: the first id a rank wrote is its
run 1, the next its run 2, and run N of every rank is run N of the log directory. Rows without
an id (written before run ids existed, or by hand) belong to the rank's latest run. A capture
belongs to the run whose ``capture_verdict`` names its directory (``step000011-schedule-2``);
a capture no verdict names belongs to the latest.

The report is of the latest run; the earlier ones are summarised in ``earlier_runs`` and never
merged into its steps, findings or verdict.

Example:
    >>> rows = [{"rank": 0, "run": "a", "steps": 5}, {"rank": 0, "run": "b", "steps": 3}]
    >>> split = split_runs(rows, [])
    >>> split.runs, [r["run"] for r in split.rows]
    (2, ['b'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profcallbacks.findings import CAPTURE_VERDICT
from profcallbacks.report.read.files import as_int


@dataclass
class RunSplit:
    """The latest run's rows and findings, and a summary of the earlier runs."""

    runs: int = 1
    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    capture_run: dict[str, int] = field(default_factory=dict)  # capture directory -> run number
    earlier: list[dict[str, Any]] = field(default_factory=list)


def split_runs(rows: list[dict[str, Any]], findings: list[dict[str, Any]]) -> RunSplit:
    """Splits the steps-file ``rows`` and ``findings`` (file order) by run (see module docstring)."""
    order: dict[int, list[str]] = {}
    for item in (*rows, *findings):
        rank, run = as_int(item.get("rank")), str(item.get("run") or "")
        ids = order.setdefault(rank, [])
        if run not in ids:
            ids.append(run)

    for rank, ids in order.items():  # rows without an id join the latest run (as before ids)
        order[rank] = [i for i in ids if i] or [""]

    def number(item: dict[str, Any]) -> int:
        ids = order[as_int(item.get("rank"))]
        run = str(item.get("run") or "")
        return ids.index(run) + 1 if run in ids else len(ids)

    runs = max((len(ids) for ids in order.values()), default=1)
    split = RunSplit(runs=runs)
    for f in findings:
        if f.get("kind") == CAPTURE_VERDICT and isinstance(f.get("details"), dict):
            capture = f["details"].get("capture")
            if isinstance(capture, str):
                split.capture_run[capture] = number(f)
    if runs == 1:
        split.rows, split.findings = list(rows), list(findings)
        return split
    latest = [r for r in rows if number(r) == runs]
    split.rows = latest
    split.findings = [f for f in findings if number(f) == runs]
    for n in range(1, runs):
        mine = [r for r in rows if number(r) == n]
        firsts = [as_int(r.get("first_step")) for r in mine]
        lasts = [as_int(r.get("last_step")) for r in mine]
        split.earlier.append({
            "run": n,
            "ids": sorted({str(r.get("run") or "") for r in (*mine, *findings)
                           if number(r) == n} - {""}),
            "first_step": min(firsts) if firsts else None,
            "last_step": max(lasts) if lasts else None,
            "findings": sum(1 for f in findings if number(f) == n),
            "captures": sorted(c for c, k in split.capture_run.items() if k == n),
        })
    return split
