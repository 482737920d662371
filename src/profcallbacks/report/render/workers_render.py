"""The per-worker table of an input-bound run, in the report's text and HTML.

The stall finding of a run whose training loop waited for its loader carries the workers'
breakdown in its details (``loader_workers``: the largest part, the workers that would keep up,
and per worker the mean fetch, collate, send, transfer and pin time of a batch). :func:`workers_table`
reads the latest such finding, every value checked (a findings file is read as found), and
:func:`workers_text` / :func:`workers_html` show it under the findings.

Example:
    >>> table = workers_table([{"kind": "dataloader_stall", "step": 9, "rank": 0, "details": {
    ...     "loader_workers": {"part": "fetch", "workers": {"rows": [
    ...         {"worker": 0, "batches": 4, "fetch_ms": 40.0, "per_s": 24.0}]}}}}])
    >>> table.headers[:3], table.rows[0][:3]
    (['worker', 'batches', 'fetch ms'], ['0', '4', '40.0'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

from profcallbacks.report.render.safe import visible

STALL = "dataloader_stall"
COLUMNS = (("fetch_ms", "fetch ms"), ("collate_ms", "collate ms"), ("send_ms", "send ms"),
           ("transfer_ms", "transfer ms"), ("pin_ms", "pin ms"), ("per_s", "batches/s"))
"""A worker row's values and their headers (``pin ms`` only where the run pinned memory)."""
MAX_ROWS = 64
MAX_LINES = 3


@dataclass(frozen=True)
class WorkersTable:
    """The checked table of one stall finding: its headers, rows and hot lines, as text."""

    step: int
    rank: int
    title: str
    headers: list[str]
    rows: list[list[str]]
    lines: list[str]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _whole(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _text(value: Any, limit: int = 200) -> str:
    return visible(str(value))[:limit]


def workers_table(findings: list[dict[str, Any]]) -> WorkersTable | None:
    """The table of the latest ``dataloader_stall`` finding with a workers' breakdown."""
    for finding in reversed(findings):
        details = finding.get("details") if finding.get("kind") == STALL else None
        found = details.get("loader_workers") if isinstance(details, dict) else None
        table = found.get("workers") if isinstance(found, dict) else None
        rows = table.get("rows") if isinstance(table, dict) else None
        if isinstance(found, dict) and isinstance(table, dict) and isinstance(rows, list):
            checked = [r for r in rows[:MAX_ROWS] if isinstance(r, dict)
                       and _whole(r.get("worker")) is not None]
            if checked:
                return _table(finding, found, table, checked)
    return None


def _table(finding: dict[str, Any], found: dict[str, Any], table: dict[str, Any],
           rows: list[dict[str, Any]]) -> WorkersTable:
    pinned = any((_number(r.get("pin_ms")) or 0.0) > 0 for r in rows)
    columns = [(k, h) for k, h in COLUMNS if k != "pin_ms" or pinned]
    cells = [[str(_whole(r.get("worker"))), str(_whole(r.get("batches")) or "-"),
              *(f"{v:.1f}" if (v := _number(r.get(k))) is not None else "-" for k, _ in columns)]
             for r in rows]
    needed, built, consumed = (_whole(found.get("workers_needed")),
                               _number(found.get("build_per_s")), _number(found.get("consume_per_s")))
    title = (f"largest part: {_text(found.get('part', '?'), 40)}"
             + (f"; {needed} workers would keep up" if needed else "")
             + (f"; {built:.1f} batches/s built, {consumed:.1f}/s consumed"
                if built is not None and consumed is not None else ""))
    lines = []
    hot = table.get("lines")
    for line in (hot if isinstance(hot, list) else [])[:MAX_LINES]:
        share = _number(line.get("share")) if isinstance(line, dict) else None
        if share is not None:
            lines.append(f"{_text(line.get('line', ''))} ({_text(line.get('phase', ''), 20)}) "
                         f"{share:.0%}")
    return WorkersTable(_whole(finding.get("step")) or 0, _whole(finding.get("rank")) or 0, title,
                        ["worker", "batches", *(h for _, h in columns)], cells, lines)


def workers_text(findings: list[dict[str, Any]]) -> list[str]:
    """The table as the text report's lines (none: no breakdown to show)."""
    t = workers_table(findings)
    if t is None:
        return []
    widths = [max(len(h), *(len(r[i]) for r in t.rows)) for i, h in enumerate(t.headers)]
    out = ["Loader workers", f"  {t.title} (dataloader_stall at step {t.step}, rank {t.rank})",
           "  " + "  ".join(h.rjust(w) for h, w in zip(t.headers, widths, strict=True)),
           "  " + "  ".join("-" * w for w in widths)]
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in t.rows]
    out += [f"  hot line: {line}" for line in t.lines]
    return out + [""]


def workers_html(findings: list[dict[str, Any]]) -> str:
    """The table as the HTML report's section (empty: no breakdown to show)."""
    t = workers_table(findings)
    if t is None:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td class=num>{escape(c)}</td>" for c in r) + "</tr>"
                   for r in t.rows)
    hot = "".join(f"<li><code>{escape(line)}</code></li>" for line in t.lines)
    return (f"<h2>Loader workers</h2><p>{escape(t.title)} (dataloader_stall at step {t.step}, "
            f"rank {t.rank})</p><table id=loader-workers><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>" + (f"<ul class=lines>{hot}</ul>" if hot else ""))
