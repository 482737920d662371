"""Where ``watch`` finds verdicts: ``capture_verdict`` findings and a report JSON (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def finding_verdict(row: dict[str, Any],
                    captures: Iterable[tuple[str, int]]) -> tuple[str, dict[str, Any]] | None:
    """``(capture directory, verdict)`` of a ``capture_verdict`` finding, else ``None``.

    The finding names its capture in ``details["capture"]`` (a directory name or path) and carries
    ``details["verdict"]`` (or the verdict's fields in ``details`` itself). Without a name, the
    capture is the latest of ``captures`` (``(name, first_step)``) that starts at or before the
    finding's step.

    Example:
        >>> finding_verdict({"step": 7, "details": {"verdict": {"kind": "input_bound"}}},
        ...                 [("step000005-schedule", 5), ("step000040-schedule", 40)])
        ('step000005-schedule', {'kind': 'input_bound'})
    """
    raw = row.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    nested = details.get("verdict")
    verdict: dict[str, Any] = nested if isinstance(nested, dict) else details
    if not verdict.get("kind"):
        return None
    name = details.get("capture") or details.get("directory")
    if isinstance(name, str) and name:
        return Path(name).name, verdict
    step = row.get("step")
    earlier = [(first, n) for n, first in captures if isinstance(step, int) and first <= step]
    return (max(earlier)[1], verdict) if earlier else None


def report_verdicts(data: Any) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """The run's ``verdict`` and ``{capture directory: verdict}`` of a report JSON (schema 2 or
    later); from schema 3 each capture's verdict carries its ``diagnoses``.

    Example:
        >>> report_verdicts({"verdict": {"kind": "host_bound"},
        ...                  "captures": [{"directory": "step000005-schedule", "verdict": None}]})
        ({'kind': 'host_bound'}, {})
        >>> report_verdicts({"captures": [{"directory": "d", "verdict": {"kind": "input_bound"},
        ...                                "diagnoses": [{"kind": "input_pipeline"}]}]})[1]
        {'d': {'kind': 'input_bound', 'diagnoses': [{'kind': 'input_pipeline'}]}}
    """
    if not isinstance(data, dict):
        return None, {}
    run = data.get("verdict")
    per_capture = {str(c.get("directory")): dict(c["verdict"], diagnoses=c.get("diagnoses") or [])
                   for c in data.get("captures") or []
                   if isinstance(c, dict) and isinstance(c.get("verdict"), dict)}
    return (run if isinstance(run, dict) else None), per_capture
