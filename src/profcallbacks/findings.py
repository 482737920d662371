"""Findings: what the detectors conclude, and every place a finding is delivered."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from profcallbacks.core.faults import RecoveringAppender
from profcallbacks.core.triggers import CaptureRequest

log = logging.getLogger("profcallbacks")

Severity = Literal["info", "warning", "error"]

# Every kind of finding, in one place (readers match on these; the strings are the on-disk contract).
DATALOADER_STALL = "dataloader_stall"
DATALOADER_STALL_CLEARED = "dataloader_stall_cleared"
DATALOADER_WAIT = "dataloader_wait"
SYNC_POINT = "sync_point"
SYNC_AUDIT = "sync_audit"  # which steps the sync audit watched, or why it did not run
STEP_SLOWDOWN = "step_slowdown"
STEP_SPEED_RECOVERED = "step_speed_recovered"
STEP_BASELINE_RESET = "step_baseline_reset"
STRAGGLER = "straggler"
CAPTURE_VERDICT = "capture_verdict"
SLOWDOWN_DIAGNOSIS = "slowdown_diagnosis"
MEMORY_CREEP = "memory_creep"
MEMORY_SITES = "memory_sites"
OUT_OF_MEMORY = "out_of_memory"
RECOMPILE = "recompile"
COMPILE_FALLBACK = "compile_fallback"
GRAPH_BREAK = "graph_break"
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_REPORTED_AT = "reported_at_step"  # the details key of a finding that came late


@dataclass(frozen=True)
class Finding:
    """One conclusion about the run, e.g. a dataloader stall or a step slowdown.

    Args:
        kind: What was found: ``"dataloader_stall"``, ``"sync_point"``, ``"step_slowdown"``, ...
        step: The step where it was found (0-based optimizer steps).
        rank: Global rank of the process that found it.
        severity: ``"info"``, ``"warning"`` or ``"error"``.
        message: One human sentence, with advice where there is some.
        details: Numbers and names behind the message (JSON-serialisable).
        capture: The capture the detector asks for with this finding (a ``CaptureRequest``:
            its trigger, e.g. ``triggers.SLOWDOWN``, and what it needs), or ``None``. Not part
            of the finding's data (``to_dict``).

    Example:
        >>> f = Finding("step_slowdown", step=120, rank=0, severity="warning", message="slow")
        >>> f.to_dict()["kind"]
        'step_slowdown'
    """

    kind: str
    step: int
    rank: int
    severity: Severity
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    capture: CaptureRequest | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["capture"]
        return data

    @property
    def reported_at_step(self) -> int | None:
        """The step the run had reached when this finding came, if findings of later steps
        came before it (``details["reported_at_step"]``, see :func:`reported_late`)."""
        step = self.details.get(_REPORTED_AT)
        return step if isinstance(step, int) else None


def reported_late(finding: Finding, reached: int) -> Finding:
    """``finding`` marked as coming at step ``reached``, after findings of later steps than its
    own (logs and findings files are streams; ``report`` and ``watch`` sort by step).

    Example:
        >>> late = reported_late(Finding("capture_verdict", 24, 0, "info", "input_bound"), 57)
        >>> late.reported_at_step, late.details
        (57, {'reported_at_step': 57})
    """
    return replace(finding, details={**finding.details, _REPORTED_AT: reached})


FindingHandler = Callable[[Finding], None]


class FindingsFile:
    """Appends findings as JSON lines; one file per rank so ranks never share a file.

    Never raises: a finding that cannot be written (disk full, read-only) is kept and written
    later, with one warning per episode of failures (:class:`RecoveringAppender`).
    """

    def __init__(self, path: Path, run_id: str | None = None) -> None:
        self.path = path
        self._out = RecoveringAppender(path, "findings")
        self._run = {"run": run_id} if run_id else {}

    def __call__(self, finding: Finding) -> None:
        row = finding.to_dict() | self._run  # "run": which run of the log directory found it
        self._out.append((json.dumps(row, default=str) + "\n").encode())

    def move_to(self, path: Path) -> None:
        """Write to ``path`` from now on (findings not yet written included)."""
        self.path = self._out.path = path

    def close(self) -> None:
        """Write what is left; never raises."""
        self._out.close()


def log_finding(finding: Finding) -> None:
    """Sends a finding to ``logging.getLogger("profcallbacks")`` at its severity, as
    ``[rank R step S] kind: message``; a message that starts by repeating its kind in words
    (``"dataloader stall: ..."``) is not repeated. A finding that came after findings of later
    steps (``details["reported_at_step"]``: a verdict the export helper made for an earlier
    capture) says so: ``[rank R step S, reported at step T]``."""
    message, said = finding.message, finding.kind.replace("_", " ") + ":"
    if message[:len(said)].lower() == said:
        message = message[len(said):].lstrip()
    late = finding.reported_at_step
    where = finding.step if late is None else f"{finding.step}, reported at step {late}"
    log.log(_LEVELS.get(finding.severity, logging.INFO), "[rank %d step %s] %s: %s",
            finding.rank, where, finding.kind, message)


_MARKDOWN = re.compile(r"([\\`*_{}\[\]<>()#+\-!|~])")


def markdown_text(text: str) -> str:
    """``text`` with every Markdown sign escaped, so a renderer shows it as written.

    Example:
        >>> print(markdown_text("__getitem__ of *data*"))
        \\_\\_getitem\\_\\_ of \\*data\\*
    """
    return _MARKDOWN.sub(r"\\\1", text)


def finding_markdown(finding: Finding) -> str:
    """One finding as a line of Markdown (TensorBoard text, W&B and MLflow notes): the severity in
    bold, the kind and message escaped (``__getitem__`` is not bold, a ``[link](...)`` no link).

    Example:
        >>> print(finding_markdown(Finding("dataloader_stall", step=3, rank=0, severity="warning",
        ...                                message="slow __getitem__")))
        **warning** step 3 rank 0 `dataloader_stall`: slow \\_\\_getitem\\_\\_
    """
    return (f"**{finding.severity}** step {finding.step} rank {finding.rank} "
            f"`{finding.kind.replace('`', '')}`: {markdown_text(finding.message)}")


class FindingRouter:
    """Collects findings and hands each to every handler; a failing handler is dropped."""

    def __init__(self, handlers: list[FindingHandler]) -> None:
        self.findings: list[Finding] = []
        self._handlers = list(handlers)

    def add_handler(self, handler: FindingHandler) -> None:
        self._handlers.append(handler)

    def emit(self, finding: Finding) -> None:
        self.findings.append(finding)
        for handler in list(self._handlers):
            try:
                handler(finding)
            except Exception as exc:  # a sink must never stop training
                log.warning("profcallbacks: finding handler %r failed (%s); it is disabled.",
                            handler, exc)
                self._handlers.remove(handler)
