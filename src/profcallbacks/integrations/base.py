"""The contract every tracker backend meets, and what they share: finding counts and rows."""

from __future__ import annotations

import importlib
import json
import logging
import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from profcallbacks.findings import CAPTURE_VERDICT, Finding
from profcallbacks.layout import MERGED_FILE, SUMMARY_SUFFIX, TRACE_FILE

FINDINGS_KEY = "profcallbacks/findings"
"""Name of the findings table (W&B) or artifact stem (MLflow), and prefix of the count scalars."""
FINDING_COLUMNS = ["step", "rank", "kind", "severity", "message"]
"""Columns of a findings table, one row per finding."""


@runtime_checkable
class RunLog(Protocol):
    """A run in an experiment tracker: a ``MetricsSink`` that takes findings too.

    ``sink(values, step)`` logs ``{"profcallbacks/step_time_ms": ...}`` at a step,
    ``sink.finding(f)`` logs one :class:`~profcallbacks.Finding` and ``sink.close()`` writes
    what is left (the findings table). None of them raises into training: a backend that fails
    is disabled by the profiler with one warning.

    Example:
        >>> class Printed:
        ...     def __call__(self, values, step): print(step, values)
        ...     def finding(self, finding): print(finding.kind)
        ...     def close(self): pass
        >>> isinstance(Printed(), RunLog)
        True
    """

    def __call__(self, values: dict[str, float], step: int) -> None: ...

    def finding(self, finding: Finding) -> None: ...

    def close(self) -> None: ...


class FindingCounts:
    """How many findings of each kind were made so far, as scalars a tracker can plot.

    Example:
        >>> counts = FindingCounts()
        >>> counts.add(Finding("sync_point", step=3, rank=0, severity="warning", message="m"))
        {'profcallbacks/findings/sync_point': 1.0}
    """

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, finding: Finding) -> dict[str, float]:
        """Count ``finding``; returns its kind's new count under ``profcallbacks/findings/<kind>``."""
        self._counts[finding.kind] += 1
        return {f"{FINDINGS_KEY}/{finding.kind}": float(self._counts[finding.kind])}


def finding_row(finding: Finding) -> list[Any]:
    """``finding`` as a row under :data:`FINDING_COLUMNS`."""
    return [finding.step, finding.rank, finding.kind, finding.severity, finding.message]


def findings_jsonl(findings: list[Finding]) -> str:
    """Findings as JSON lines, the format of the run's own findings file."""
    return "".join(json.dumps(f.to_dict(), default=str) + "\n" for f in findings)


VERDICT_KEY = "profcallbacks/verdict"
"""The run summary key (W&B) / tag (MLflow) holding the latest capture's verdict."""


@dataclass(frozen=True)
class CaptureVerdict:
    """What a tracker records of one exported capture: its verdict and its trace files.

    Attributes:
        name: The capture directory's name (``step000120-schedule``).
        verdict: The verdict as shown, ``input_bound (80%)``.
        files: The capture's published trace files (per rank, and the merged one), regular files
            only; empty when the directory is unknown or gone.
    """

    name: str
    verdict: str
    files: tuple[Path, ...]


def capture_verdict(finding: Finding) -> CaptureVerdict | None:
    """The capture a ``capture_verdict`` finding is about, else ``None``.

    Example:
        >>> f = Finding("capture_verdict", step=9, rank=0, severity="info", message="m",
        ...             details={"capture": "step000005-schedule", "kind": "input_bound", "share": 0.8})
        >>> capture_verdict(f)
        CaptureVerdict(name='step000005-schedule', verdict='input_bound (80%)', files=())
    """
    details = finding.details
    if finding.kind != CAPTURE_VERDICT or not details.get("kind"):
        return None
    share = details.get("share")
    verdict = str(details["kind"]) + (f" ({share:.0%})" if isinstance(share, (int, float)) else "")
    directory = details.get("directory")
    files = _trace_files(Path(directory)) if isinstance(directory, str) else ()
    return CaptureVerdict(str(details.get("capture", "")), verdict, files)


def _trace_files(directory: Path) -> tuple[Path, ...]:
    """The trace files of a published capture directory and their summaries (no links, nothing
    but regular files)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return ()
    out = []
    for name in names:
        if TRACE_FILE.match(name) or MERGED_FILE.match(name) or name.endswith(SUMMARY_SUFFIX):
            try:
                if stat.S_ISREG(os.lstat(directory / name).st_mode):
                    out.append(directory / name)
            except OSError:
                continue
    return tuple(out)


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` or raise an ``ImportError`` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs the {module!r} package ({exc}): "
                          f"pip install 'profcallbacks[{extra}]'") from exc


class Closable(Protocol):
    def close(self) -> None: ...


def close_quietly(sink: Closable) -> None:
    """``sink.close()``, with a warning instead of an error: the run's end never fails on it."""
    try:
        sink.close()
    except Exception as exc:
        logging.getLogger(__name__).warning("profcallbacks: %r could not be closed (%s).", sink, exc)


def check_metrics_sink(owner: str, sink: Any) -> Any:
    """``sink`` if it is ``None`` or callable; else a ``ValueError`` naming the option and the fix."""
    if sink is not None and not callable(sink):
        raise ValueError(f"{owner}(metrics_sink={sink!r}): expected a callable taking (scalars: "
                         "dict[str, float], step: int), or None. Use e.g. "
                         "metrics_sink=WandbSink(run) or metrics_sink=MlflowSink().")
    return sink


def extra_sinks(sink: Any) -> list[Any]:
    """The metrics sinks list for an optional ``metrics_sink``."""
    return [] if sink is None else [sink]
