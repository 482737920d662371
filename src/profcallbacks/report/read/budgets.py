"""What the byte budgets did to a run: trimmed and over-budget captures, removals, merged traces."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from profcallbacks.layout import retention_log_file
from profcallbacks.report.read.files import read_jsonl

_HEAD_BYTES = 1 << 16
_MERGE_KEY = b'{"profcallbacks_merge":'


def capture_budget(files: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The capture's ``budget`` entry from its files' metadata and sizes, or ``None`` (no budget).

    ``trimmed`` lists what was trimmed on any rank, ``over_budget`` the files larger on disk
    than the budget they were planned for (kept whole, never cut).
    """
    blocks = [(f, f["budget"]) for f in files if isinstance(f.get("budget"), dict)]
    if not blocks:
        return None
    trimmed = list(dict.fromkeys(str(t) for _, b in blocks for t in b.get("trimmed") or []))
    budget = max(_number(b.get("capture_bytes")) for _, b in blocks)
    over = [f["path"] for f, b in blocks if f.get("bytes", 0) > _number(b.get("capture_bytes"))]
    reasons = list(dict.fromkeys(str(b["reason"]) for _, b in blocks if b.get("reason")))
    return {"capture_bytes": budget, "trimmed": trimmed, "reason": "; ".join(reasons),
            "over_budget": over}


def merged_trace(path: Path, root: Path) -> dict[str, Any]:
    """The merged trace's entry: its path, size and the ``profcallbacks_merge`` block (read from
    the first 64 KiB only: the block comes first in the file)."""
    entry: dict[str, Any] = {"path": str(path.relative_to(root)), "bytes": 0, "ranks": [],
                             "max_residual_skew_us": None, "aligned_on": None, "reduced": None}
    try:
        entry["bytes"] = path.stat().st_size
        with open(path, "rb") as raw:
            head = gzip.GzipFile(fileobj=raw).read(_HEAD_BYTES)
        if not head.startswith(_MERGE_KEY):
            raise ValueError("no profcallbacks_merge block at its start")
        block, _ = json.JSONDecoder().raw_decode(head[len(_MERGE_KEY):].decode("utf-8", "replace"))
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        return entry
    if isinstance(block, dict):
        for key in ("ranks", "max_residual_skew_us", "aligned_on", "reduced", "steps_kept",
                    "min_event_us", "collectives_matched", "capture_bytes"):
            entry[key] = block.get(key)
    return entry


def removed_captures(root: Path, problems: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Captures removed to keep the log directory within its budget (``retention.jsonl``)."""
    path = retention_log_file(root)
    if not path.is_file():
        return []
    keys = ("time", "capture", "trigger", "bytes", "logdir_bytes", "reason")
    return [{k: row.get(k) for k in keys} for row in read_jsonl(path, problems)
            if isinstance(row.get("capture"), str)]


def budget_lines(report: dict[str, Any]) -> list[str]:
    """Text lines for the report: trims, over-budget files, merged traces and removals."""
    out: list[str] = []
    for c in report["captures"]:
        budget = c.get("budget")
        if budget and budget["trimmed"]:
            out.append(f"  {c['directory']}: trimmed to {size(budget['capture_bytes'])}: "
                       f"{', '.join(budget['trimmed'])} ({budget['reason']})")
        if budget and budget["over_budget"]:
            out.append(f"  {c['directory']}: over its budget of "
                       f"{size(budget['capture_bytes'])}, kept whole: {', '.join(budget['over_budget'])}")
        merged = c.get("merged")
        if merged:
            skew = merged.get("max_residual_skew_us")
            aligned = (f"clocks aligned on {merged.get('collectives_matched')} collectives, "
                       f"residual skew {skew:.0f} us" if isinstance(skew, (int, float))
                       else "clocks as recorded (no collective to align on)")
            out.append(f"  {c['directory']}: merged trace of {len(merged['ranks'] or [])} ranks "
                       f"{merged['path']} ({size(merged['bytes'])}; {aligned}"
                       + ("; reduced to fit its budget" if merged.get("reduced") else "") + ")")
    for row in report.get("removed_captures") or []:
        out.append(f"  removed {row['capture']} ({row['trigger']}, "
                   f"{size(row['bytes'])}): {row['reason']}")
    return (["Trace budgets"] + out + [""]) if out else []


def size(value: Any) -> str:
    """Bytes in words: ``"30 kB"``, ``"1.5 MB"``."""
    number = _number(value)
    return f"{number / 1e3:.0f} kB" if number < 1e6 else f"{number / 1e6:.1f} MB"


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
