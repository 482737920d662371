"""The rows ``watch`` shows, checked field by field: a hostile or corrupt line is skipped, never shown.

Whoever can write into a shared log directory decides what the per-rank files hold. ``report``
already skips a row whose numbers are not finite or whose fields have the wrong type; ``watch``
reads the same files line by line as they grow and holds the same line: each steps row and each
finding is checked here before it reaches the live view, and every string it keeps is bounded and
made visible (control and bidi characters escaped, see ``report.safe.visible``). The view then
hands these strings to rich as plain text, never as markup.

Example:
    >>> steps_row({"last_step": 9, "steps": 10, "step_time_ms_median": 1.5})["last_step"]
    9
    >>> steps_row({"last_step": "abc", "steps": 10, "step_time_ms_median": 1.5}) is None
    True
    >>> finding_row({"kind": "sync_point", "step": 3, "rank": 0, "severity": "warning",
    ...              "message": "[link=https://x]\\x1b]0;t\\x07"})["message"]
    '[link=https://x]\\\\x1b]0;t\\\\x07'
"""

from __future__ import annotations

import math
import re
from typing import Any

from profcallbacks.report.render.safe import visible

MAX_STEP = 1 << 62
"""Largest step or rank number taken (a bigger one is garbage, not a run)."""
MAX_TEXT = 2000
"""Most characters of a finding's message kept (the view shows at most 160)."""
MAX_NAME = 64
"""Most characters of a finding's kind or severity, or a capture's name in a verdict."""
_MEMORY_KEY = re.compile(r"^[a-z][a-z0-9_]{0,40}_mb$")
_TIMES = ("step_time_ms", "step_time_ms_median", "step_time_ms_max", "data_wait_ms", "compile_ms")
_RATIOS = ("data_wait_share", "slowdown_ratio")


def whole(value: Any, *, lowest: int = 0) -> int | None:
    """``value`` when it is an integer (not a bool) in ``[lowest, MAX_STEP)``, else ``None``."""
    if type(value) is not int or not lowest <= value < MAX_STEP:
        return None
    return value


def finite(value: Any, *, lowest: float = 0.0) -> float | None:
    """``value`` as a float when it is a finite number at least ``lowest``, else ``None``."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < lowest:
        return None
    return float(value)


def text(value: Any, limit: int) -> str:
    """``value`` as visible text of at most ``limit`` characters (``str()`` of anything else)."""
    raw = value if isinstance(value, str) else str(value)
    if len(raw) > limit:
        raw = raw[:limit - 3] + "..."
    return visible(raw)


def steps_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The checked form of one ``rank<N>.steps.jsonl`` row, or ``None`` when it cannot be shown.

    ``last_step`` and ``steps`` must be whole numbers and ``step_time_ms_median`` a finite number;
    optional numbers that are not finite are dropped, and so are ``*_mb`` keys that are not plain
    names.
    """
    last, steps = whole(row.get("last_step")), whole(row.get("steps", 0))
    median = finite(row.get("step_time_ms_median"))
    if last is None or steps is None or median is None:
        return None
    out: dict[str, Any] = {"last_step": last, "steps": steps, "step_time_ms_median": median}
    for key in _TIMES[:1] + _TIMES[2:] + _RATIOS:
        number = finite(row.get(key))
        if number is not None:
            out[key] = number
    for key, value in row.items():
        number = finite(value)
        if number is not None and isinstance(key, str) and _MEMORY_KEY.match(key):
            out[key] = number
    return out


def finding_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The checked form of one ``rank<N>.findings.jsonl`` row, or ``None`` when it cannot be shown.

    ``step`` and ``rank`` must be whole numbers (``step`` -1 for a run-level finding); the strings
    are bounded and visible; ``details`` is kept only when it is an object.
    """
    step, rank = whole(row.get("step"), lowest=-1), whole(row.get("rank"))
    if step is None or rank is None or not isinstance(row.get("kind"), str):
        return None
    details = row.get("details")
    out = {"kind": text(row["kind"], MAX_NAME), "step": step, "rank": rank,
           "severity": text(row.get("severity", "info"), MAX_NAME),
           "message": text(row.get("message", ""), MAX_TEXT),
           "details": details if isinstance(details, dict) else {}}
    if row.get("run") is not None:
        out["run"] = text(row["run"], MAX_NAME)
    return out


_WORKER_MS = ("fetch_ms", "collate_ms", "send_ms", "transfer_ms", "pin_ms", "busy_ms", "per_s")


def loader_workers(details: dict[str, Any]) -> dict[str, Any] | None:
    """The checked per-worker table of a ``dataloader_stall`` finding's ``loader_workers``
    details (``None``: none, or not one to show): ``part``, ``needed``, ``build_per_s``,
    ``consume_per_s``, ``line`` and ``rows`` of ``worker``, ``batches`` and the mean times.

    Example:
        >>> loader_workers({"loader_workers": {"part": "fetch", "workers": {"rows": [
        ...     {"worker": 0, "batches": 9, "fetch_ms": 40.0, "busy_ms": 41.0}]}}})["rows"][0]
        {'worker': 0, 'batches': 9, 'fetch_ms': 40.0, 'busy_ms': 41.0}
    """
    found = details.get("loader_workers")
    table = found.get("workers") if isinstance(found, dict) else None
    rows = table.get("rows") if isinstance(table, dict) else None
    if not isinstance(found, dict) or not isinstance(table, dict) or not isinstance(rows, list):
        return None
    out_rows = []
    for row in rows[:64]:
        if not isinstance(row, dict) or whole(row.get("worker")) is None:
            continue
        checked: dict[str, Any] = {"worker": row["worker"], "batches": whole(row.get("batches"))}
        for key in _WORKER_MS:
            number = finite(row.get(key))
            if number is not None:
                checked[key] = number
        out_rows.append(checked)
    lines = table.get("lines")
    first = lines[0] if isinstance(lines, list) and lines and isinstance(lines[0], dict) else {}
    share = finite(first.get("share"))
    return {"part": text(found.get("part", "?"), MAX_NAME),
            "needed": whole(found.get("workers_needed")),
            "build_per_s": finite(found.get("build_per_s")),
            "consume_per_s": finite(found.get("consume_per_s")),
            "line": (text(first.get("line", ""), 200) + (f" {share:.0%}" if share is not None
                                                           else "")) if first else "",
            "rows": out_rows}
