"""Reads a trace's summary (``<trace>.summary``) back into the report's ``TraceSummary``.

A report opens a full trace only when its summary is missing or stale (``capture/summary_file.py``
ties the two by size, modification time and hash); ``SummaryUse`` counts which way each file was
read, so a report says how many traces it did not have to open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profcallbacks.capture.summary_file import MATCH, MISSING, load_summary
from profcallbacks.report.read.generations import TraceFormat
from profcallbacks.report.read.traces import TraceSummary


@dataclass
class SummaryUse:
    """Which files a report read from their summaries and which it parsed.

    Attributes:
        read: Files read from their summary (their trace not opened).
        parsed: Files whose trace was parsed (``missing`` + ``stale``, or summaries not used).
        missing: Files without a summary.
        stale: ``{"file", "why"}`` of summaries that no longer describe their trace.
    """

    read: int = 0
    parsed: int = 0
    missing: int = 0
    stale: list[dict[str, str]] = field(default_factory=list)

    def add(self, other: SummaryUse) -> None:
        """Counts ``other``'s files too (one file's use, counted in a worker process)."""
        self.read += other.read
        self.parsed += other.parsed
        self.missing += other.missing
        self.stale += other.stale

    def public(self) -> dict[str, Any]:
        """The report's ``summaries`` entry."""
        return {"read": self.read, "parsed": self.parsed, "missing": self.missing,
                "stale": self.stale}


def _ops(value: Any) -> dict[str, list[float]]:
    """An operator table of a record (name -> numbers), taken as parsed (JSON: string keys)."""
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise TypeError(f"operator table must map names to lists, got {type(value).__name__}")
    return value


def summary_from_record(record: dict[str, Any], path: Path) -> TraceSummary:
    """The ``TraceSummary`` (with its ``analysis``) a summary record describes, for ``path``.

    Raises:
        KeyError, TypeError, ValueError: The record lacks a field or holds the wrong type.
    """
    fmt = record.get("trace_format") or {}
    known = {f for f in TraceFormat.__dataclass_fields__}
    return TraceSummary(
        path=path, rank=int(record["rank"]), world_size=int(record["world_size"]),
        worker=str(record["worker"]), trigger=record.get("trigger"),
        partial=bool(record.get("partial")), export_overlap=bool(record.get("export_overlap")),
        budget=record.get("budget"), steps=list(record["steps"]),
        cpu_ops=_ops(record["cpu_ops"]), gpu_ops=_ops(record["gpu_ops"]),
        bad_events=int(record.get("bad_events") or 0),
        bad_example=str(record.get("bad_example") or ""),
        analysis=dict(record["analysis"]),
        format=TraceFormat(**{k: v for k, v in fmt.items() if k in known}))


def read_summary(path: Path, use: SummaryUse) -> tuple[TraceSummary, dict[str, Any]] | None:
    """``path``'s summary as a ``TraceSummary`` and its raw record, counted in ``use``; ``None``
    when it is missing or stale (the caller parses the trace and counts that)."""
    loaded = load_summary(path)
    if loaded.status == MATCH and loaded.record is not None:
        try:
            summary = summary_from_record(loaded.record, path)
        except (KeyError, TypeError, ValueError) as exc:
            use.stale.append({"file": str(path), "why": f"summary malformed ({exc!r})"})
            return None
        use.read += 1
        return summary, loaded.record
    if loaded.status == MISSING:
        use.missing += 1
    else:
        use.stale.append({"file": str(path), "why": loaded.why})
    return None
