"""Where step summaries and findings are written: TensorBoard, JSON-lines files, loggers."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profcallbacks.core.timing import IntervalSummary
from profcallbacks.findings import Finding

log = logging.getLogger(__name__)

MetricsSink = Callable[[dict[str, float], int], None]
"""Receives ``{"profcallbacks/step_time_ms": ...}`` and the step number."""


class TensorBoardWriter:
    """Scalars and findings as TensorBoard data, next to the run's own scalars.

    Scalars are buffered and handed to the ``SummaryWriter`` at most every ``batch_s`` seconds:
    each hand-over wakes its writer thread, which then competes with training for the GIL.
    Without ``tensorboard`` installed this sink says so once and turns itself off.
    """

    def __init__(self, logdir: Path, *, batch_s: float = 5.0) -> None:
        self._logdir = logdir
        self._writer: Any = None
        self._disabled = False
        self._batch_s = batch_s
        self._buffer: list[tuple[dict[str, float], int]] = []
        self._next_write = 0.0

    def start(self) -> None:
        self._get()

    def _get(self) -> Any:
        if self._writer is None and not self._disabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                log.info("profcallbacks: tensorboard is not installed, so no scalars are written "
                         "(pip install 'profcallbacks[tensorboard]').")
                self._disabled = True
                return None
            self._writer = SummaryWriter(log_dir=str(self._logdir))
        return self._writer

    def scalars(self, values: dict[str, float], step: int) -> None:
        self._buffer.append((values, step))
        now = time.monotonic()
        if now >= self._next_write:
            self._next_write = now + self._batch_s
            self._write_buffer()

    def _write_buffer(self) -> None:
        writer = self._get()
        buffer, self._buffer = self._buffer, []
        if writer is not None:
            for values, step in buffer:
                for tag, value in values.items():
                    writer.add_scalar(tag, value, step)

    def finding(self, finding: Finding) -> None:
        writer = self._get()
        if writer is not None:
            writer.add_text(f"profcallbacks/findings/{finding.kind}",
                            f"**{finding.severity}** (rank {finding.rank}): {finding.message}",
                            finding.step)
            writer.flush()

    def close(self) -> None:
        self._write_buffer()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class StepsFile:
    """Appends one JSON line per step-time summary, for ``profcallbacks report``.

    Kept open (line-buffered) for the whole run: opening a file costs far more than a step's
    budget on a slow or shared disk.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def write(self, summary: IntervalSummary, rank: int,
              fields: dict[str, float] | None = None) -> None:
        row = {"rank": rank, "first_step": summary.first_step, "last_step": summary.last_step,
               "steps": summary.steps, **summary.scalars(), **(fields or {})}
        self._file.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._file.close()


def metric_names(summary: IntervalSummary, prefix: str) -> dict[str, float]:
    """Scalars of ``summary`` under ``prefix``, e.g. ``profcallbacks/step_time_ms``."""
    return {f"{prefix}/{name}": value for name, value in summary.scalars().items()}


class SummaryPublisher:
    """Hands each step-time summary to the metrics sinks, TensorBoard and the steps file.

    A sink that raises is dropped with one warning; training never notices.

    Example:
        >>> seen = []
        >>> publisher = SummaryPublisher("profcallbacks", rank=0, tensorboard=None, steps_file=None,
        ...                              sinks=[lambda values, step: seen.append((step, values))])
        >>> summary = IntervalSummary(0, 49, 50, 10.0, 9.5, 30.0, 2.0)
        >>> publisher.publish(summary, extra={"slowdown_ratio": 1.0})
        >>> seen[0][0], seen[0][1]["profcallbacks/step_time_ms"], seen[0][1]["profcallbacks/slowdown_ratio"]
        (49, 10.0, 1.0)
    """

    def __init__(self, prefix: str, *, rank: int, sinks: list[MetricsSink],
                 tensorboard: TensorBoardWriter | None, steps_file: StepsFile | None) -> None:
        self._prefix = prefix
        self._rank = rank
        self._sinks = list(sinks) + ([tensorboard.scalars] if tensorboard is not None else [])
        self._steps_file = steps_file

    def publish(self, summary: IntervalSummary, extra: dict[str, float],
                fields: dict[str, float] | None = None) -> None:
        """``extra`` scalars go to the sinks; ``fields`` (e.g. memory numbers) to the steps file too."""
        values = metric_names(summary, self._prefix)
        values.update({f"{self._prefix}/{name}": value for name, value in extra.items()})
        values.update({f"{self._prefix}/{name}": value for name, value in (fields or {}).items()})
        for sink in list(self._sinks):
            try:
                sink(values, summary.last_step)
            except Exception as exc:
                log.warning("profcallbacks: metrics sink %r failed (%s); it is disabled.",
                            sink, exc)
                self._sinks.remove(sink)
        if self._steps_file is not None:
            try:
                self._steps_file.write(summary, self._rank, fields)
            except (OSError, ValueError) as exc:
                log.warning("profcallbacks: cannot write %s (%s); step summaries are no longer "
                            "saved.", self._steps_file.path, exc)
                self._steps_file = None

    def close(self) -> None:
        if self._steps_file is not None:
            self._steps_file.close()
