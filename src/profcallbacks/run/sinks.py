"""Where step summaries and findings are written: TensorBoard, JSON-lines files, loggers."""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profcallbacks.core.faults import RecoveringAppender
from profcallbacks.core.timing import IntervalSummary
from profcallbacks.findings import Finding, finding_markdown

log = logging.getLogger(__name__)

MetricsSink = Callable[[dict[str, float], int], None]
"""Receives ``{"profcallbacks/step_time_ms": ...}`` and the step number."""
TENSORBOARD_BATCH_S = 5.0
"""Seconds between two writes of buffered TensorBoard scalars (findings are written at once)."""


class TensorBoardWriter:
    """Scalars and findings as TensorBoard data, next to the run's own scalars.

    Events are encoded here and appended to one ``events.out.tfevents.*`` file at most every
    ``batch_s`` seconds (default :data:`TENSORBOARD_BATCH_S`; findings at once), on the calling
    thread: no writer thread competes with training for the GIL or prints a traceback when the
    disk fills up. A write that fails (disk
    full, read-only) is undone, warned about once and retried (:class:`RecoveringAppender`).
    Without ``tensorboard`` installed this sink says so once and turns itself off.
    """

    def __init__(self, logdir: Path, *, batch_s: float | None = None) -> None:
        self._logdir = logdir
        self._file: RecoveringAppender | None = None
        self._disabled = False
        self._batch_s = TENSORBOARD_BATCH_S if batch_s is None else batch_s
        self._buffer: list[tuple[dict[str, float], int]] = []
        self._next_write = 0.0

    def start(self) -> None:
        self._get()

    def _get(self) -> RecoveringAppender | None:
        if self._file is None and not self._disabled:
            try:
                from tensorboard.compat.proto.event_pb2 import Event
            except ImportError:
                log.info("profcallbacks: tensorboard is not installed, so no scalars are written "
                         "(pip install 'profcallbacks[tensorboard]').")
                self._disabled = True
                return None
            name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                    f"{os.getpid()}.{next(_EVENT_FILES)}")
            header = _record(Event(wall_time=time.time(), file_version="brain.Event:2"))
            self._file = RecoveringAppender(self._logdir / name, "TensorBoard events", header=header)
            self._file.flush(force=True)
        return self._file

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        self._buffer.append((values, step))
        now = time.monotonic()
        if now >= self._next_write:
            self._next_write = now + self._batch_s
            self._write_buffer()

    def _write_buffer(self) -> None:
        out = self._get()
        buffer, self._buffer = self._buffer, []
        if out is None or not buffer:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        wall = time.time()
        for values, step in buffer:  # one event per summary: its records cost ~0.1 us per byte
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)
                                     for tag, value in values.items()])
            out.append(_event(summary, step, wall), flush=False)
        out.flush()

    def finding(self, finding: Finding) -> None:
        out = self._get()
        if out is not None:
            from torch.utils.tensorboard.summary import text

            out.append(_event(text(f"profcallbacks/findings/{finding.kind}", finding_markdown(finding)),
                              finding.step, time.time()))

    def close(self) -> None:
        """Write what is buffered; never raises (a failure is a warning)."""
        try:
            self._write_buffer()
        except Exception as exc:
            log.warning("profcallbacks: TensorBoard scalars could not be written (%s).", exc)
        if self._file is not None:
            self._file.close()
            self._file = None


_EVENT_FILES = itertools.count()


def _record(event: Any) -> bytes:
    """One TFRecord: length, masked CRC of the length, the event, masked CRC of the event."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    out = io.BytesIO()
    RecordWriter(out).write(event.SerializeToString())
    return out.getvalue()


def _event(summary: Any, step: int, wall_time: float) -> bytes:
    from tensorboard.compat.proto.event_pb2 import Event

    return _record(Event(wall_time=wall_time, step=step, summary=summary))


STEPS_FLUSH_S = 1.0
"""Seconds between writes of the steps file (lines wait in memory meanwhile)."""
STEPS_MAX_HELD = 800
"""Most steps whose summaries the steps file holds back (bounded memory whatever the step rate)."""


class StepsFile:
    """Appends one JSON line per step-time summary, for ``profcallbacks report``.

    Lines are written at most every ``flush_s`` seconds, or once the queued summaries cover
    :data:`STEPS_MAX_HELD` steps, and at ``close``: opening, writing and closing the file costs
    ~150 us between training steps (3 us per step if done per summary of 50 short steps), and
    encoding a few rows at once costs less than one at a time. A line that cannot be written
    (disk full, read-only) is kept in memory and written later; the file is opened for each
    write so no descriptor pins a file system that is being remounted.
    """

    def __init__(self, path: Path, *, flush_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, run_id: str | None = None) -> None:
        self.path = path
        self._run = {"run": run_id} if run_id else None  # which run of the log directory
        self._out = RecoveringAppender(path, "step summaries")
        self._flush_s = STEPS_FLUSH_S if flush_s is None else flush_s
        self._clock = clock
        self._next_flush = float("-inf")  # the first line is written at once
        # summaries wait here unencoded: encoding a few rows at once, once a second, costs less
        # than one row between every few training steps (the encoder's code stays in the cache)
        self._rows: list[tuple[IntervalSummary, int, dict[str, float] | None]] = []
        self._held = 0  # steps the queued summaries cover

    def write(self, summary: IntervalSummary, rank: int,
              fields: dict[str, float] | None = None) -> None:
        """Queue one summary's line; write the queued lines when ``flush_s`` has passed."""
        self._rows.append((summary, rank, fields))
        self._held += summary.steps
        now = self._clock()
        if now >= self._next_flush or self._held >= STEPS_MAX_HELD:
            self._next_flush = now + self._flush_s
            self.flush()

    def flush(self) -> None:
        """Encode and write the queued lines (a failed write keeps them for a retry)."""
        rows, self._rows, self._held = self._rows, [], 0
        if rows:
            self._out.append(b"".join([_steps_line(*row, self._run) for row in rows]), flush=False)
        self._out.flush()

    def move_to(self, path: Path) -> None:
        """Write to ``path`` from now on (lines not yet written included)."""
        self.path = self._out.path = path

    def close(self) -> None:
        self.flush()
        self._out.close()


def _steps_line(summary: IntervalSummary, rank: int, fields: dict[str, float] | None,
                run: dict[str, str] | None = None) -> bytes:
    row = {**(run or {}), "rank": rank, "first_step": summary.first_step, "last_step": summary.last_step,
           "steps": summary.steps, **summary.scalars(), "max_step": summary.max_step,
           "steps_excluded": summary.steps_excluded,
           "counted_us": list(summary.counted_us),
           "counted_data_wait_ms": round(summary.counted_data_wait_ms, 4), **(fields or {})}
    return (json.dumps(row) + "\n").encode()


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
        self._sinks = list(sinks) + ([tensorboard.write_scalars] if tensorboard is not None else [])
        self._steps_file = steps_file

    @property
    def steps_file(self) -> StepsFile | None:
        return self._steps_file

    def publish(self, summary: IntervalSummary, extra: dict[str, float],
                fields: dict[str, float] | None = None) -> None:
        """``extra`` scalars (e.g. ``slowdown_ratio``) and ``fields`` (memory numbers) go to the
        sinks and into the steps file's row, where ``watch`` and the report read them."""
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
                self._steps_file.write(summary, self._rank, {**extra, **(fields or {})})
            except (OSError, ValueError) as exc:
                log.warning("profcallbacks: cannot write %s (%s); step summaries are no longer "
                            "saved.", self._steps_file.path, exc)
                self._steps_file = None

    def write_pending(self) -> None:
        """Write the steps file's queued lines now; never raises (a failed write keeps them)."""
        if self._steps_file is not None:
            try:
                self._steps_file.flush()
            except (OSError, ValueError) as exc:
                log.warning("profcallbacks: cannot write %s (%s).", self._steps_file.path, exc)

    def close(self) -> None:
        """Write what is left; never raises."""
        if self._steps_file is not None:
            self._steps_file.close()
