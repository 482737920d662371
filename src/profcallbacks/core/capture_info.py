"""What one capture window is: the record the exporter, the helper process and the live analysis share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profcallbacks.core.ranks import RankInfo


@dataclass(frozen=True)
class StepSpan:
    """Wall-clock bounds of one captured step, in ``time.time_ns()`` nanoseconds."""

    step: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class CaptureInfo:
    """What the exporter knows about one capture window."""

    name: str
    trigger: str
    first_step: int
    steps: tuple[StepSpan, ...]
    partial: bool
    pid: int
    tid: int
    rank: RankInfo
    backend: str | None = None
    export_overlap: bool = False  # recorded while an earlier capture was being exported
    budget: dict[str, Any] | None = None  # what the byte budget predicted and trimmed
    pieces: tuple[str, ...] = ()  # raw traces of its first steps, saved before the main one
    findings: tuple[dict[str, Any], ...] = ()  # the rank's findings at its end, for its track
    # the loader workers' spans: (worker, batch index, "fetch"/"collate"/"send", start, end ns)
    loader: tuple[tuple[int, int, str, int, int], ...] = ()
    cpu: dict[str, Any] | None = None  # the machine's load while it recorded (core/cpu_load.py)
