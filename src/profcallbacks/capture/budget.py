"""The capture byte budget at window boundaries: the prediction, the trim, and what it learned.

The controller asks :meth:`CaptureBudget.before_window` when a window is about to record. With no
earlier capture to predict from, the window's first recorded step is saved on its own as soon as
it ends and measured (:meth:`CaptureBudget.first_step_saved`): the rest of the window is then
trimmed to fit. That step stays the first of the capture when the options it was recorded with
fit; when they must be trimmed, it is dropped and the rest of the window records with the
trimmed options (a window of one step records it again, one step later). The joined trace is
the helper's work (``pieces.stitch``). Each capture's raw size (known as soon as kineto saved it) and,
once published, its size on disk feed the prediction of the next one (``trimming.CaptureSizer``).

Measuring the first step costs no more than recording it in the window's own profiler: kineto's
stop and save take the same time per event whether a window stops once or twice.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from profcallbacks.capture.planner import Window
from profcallbacks.capture.trace_writer import GZIP_LEVEL
from profcallbacks.capture.trimming import CaptureSizer, Trim
from profcallbacks.options.trace import TraceOptions

log = logging.getLogger(__name__)

RATIO_SAMPLE_BYTES = 1 << 18
"""Bytes of the first step's raw trace gzipped to learn the ratio (~1 ms; the whole of a 12 MB
step would take ~30 ms on the training thread)."""


class CaptureBudget:
    """Trims each window to ``capture_bytes`` and learns from each capture written.

    Example:
        >>> budget = CaptureBudget(5_000_000)
        >>> window, options, measure_first = budget.before_window(Window(0, 1, 3, "schedule"),
        ...                                                       TraceOptions())
        >>> measure_first  # nothing measured yet: its first step is saved on its own
        True
    """

    def __init__(self, capture_bytes: int) -> None:
        self.sizer = CaptureSizer(capture_bytes)
        self._first_step_bytes: float | None = None  # predicted on disk, from a first step saved
        self._trims: dict[Window, Trim] = {}
        self._unmeasured: dict[str, tuple[int, str]] = {}  # capture name -> raw bytes, file name

    def before_window(self, window: Window,
                      options: TraceOptions) -> tuple[Window, TraceOptions, bool]:
        """The window and options to record with, and whether to save its first step on its own
        to measure it (nothing of this run was measured yet)."""
        if self.sizer.knows_nothing:
            self._trims[window] = Trim(options, window.active, window.active, None,
                                       reason="no earlier capture to predict from")
            return window, options, True
        trim = self.sizer.plan(options, window.active, trigger=window.trigger)
        return self._planned(replace(window, active=trim.active), trim), trim.options, False

    def first_step_saved(self, window: Window, options: TraceOptions, raw: Path,
                         raw_bytes: int) -> tuple[Window, TraceOptions, bool]:
        """The window's first recorded step was saved on its own to ``raw``: learn from it and
        plan the rest. Returns the window and options to go on with, and whether that step
        stays in the capture.

        When the options must be trimmed, the step is dropped: a window of several steps keeps
        its name and records the rest of its steps trimmed (every rank names its captures
        alike, whatever each measured); a window of one step records it again, one step
        later."""
        self._trims.pop(window, None)
        self.sizer.record_raw(options, steps=1, raw_bytes=raw_bytes)
        with contextlib.suppress(OSError), open(raw, "rb") as f:  # ours, in a private directory
            sample = f.read(RATIO_SAMPLE_BYTES)
            if sample:
                self.sizer.record_disk(raw_bytes=len(sample),
                                       disk_bytes=len(zlib.compress(sample, GZIP_LEVEL)))
        self._first_step_bytes = self.sizer.per_step(options)
        trim = self.sizer.plan(options, window.active, trigger=window.trigger)
        if trim.options == options:
            return self._planned(replace(window, active=trim.active), trim), options, True
        if window.active > 1:  # the window's other steps record trimmed, under the same name
            trim = self.sizer.plan(options, window.active, trigger=window.trigger,
                                   most=window.active - 1)
            later = replace(window, active=trim.active + 1)  # led by the dropped step
        else:  # its one step is recorded again, one step later
            later = replace(window, warmup=window.warmup + 1)
        trim = replace(trim, reason=trim.reason + "; the first step, recorded with the options "
                       "asked for to measure them, was dropped")
        return self._planned(later, trim), trim.options, False

    def _planned(self, window: Window, trim: Trim) -> Window:
        """Keep ``trim`` for the capture of ``window`` (its metadata) and log what it trims."""
        self._trims[window] = trim
        if trim.trimmed:
            log.info("profcallbacks: capture %s trimmed to its budget of %.1f MB: %s (%s).",
                     window.dir_name(), self.sizer.capture_bytes / 1e6, ", ".join(trim.trimmed),
                     trim.reason)
        return window

    def metadata(self, window: Window) -> dict[str, Any] | None:
        """The ``budget`` block for the capture of ``window`` (``None`` when it was not planned)."""
        trim = self._trims.pop(window, None)
        if trim is None:
            return None
        return trim.metadata(self.sizer.capture_bytes, self._first_step_bytes)

    def recorded(self, name: str, file_name: str, options: TraceOptions, *, steps: int,
                 raw_bytes: int | None) -> None:
        """A capture was saved by kineto: ``raw_bytes`` for ``steps`` steps with ``options``."""
        if raw_bytes is None:
            return
        self.sizer.record_raw(options, steps=steps, raw_bytes=raw_bytes)
        self._unmeasured[name] = (raw_bytes, file_name)

    def published(self, directories: list[Path]) -> None:
        """Learn the gzip ratio from captures of this rank now on disk."""
        for directory in directories:
            base = directory.name
            for name in [n for n in self._unmeasured if base == n or base.startswith(n + "-")]:
                raw_bytes, file_name = self._unmeasured.pop(name)
                with contextlib.suppress(OSError):
                    disk = (directory / file_name).lstat().st_size
                    self.sizer.record_disk(raw_bytes=raw_bytes, disk_bytes=disk)
                    if disk > self.sizer.capture_bytes:
                        log.warning("profcallbacks: capture %s came out at %.1f MB, over its budget "
                                    "of %.1f MB; it is kept (marked in the report) and the next "
                                    "capture is trimmed by its size.", directory.name, disk / 1e6,
                                    self.sizer.capture_bytes / 1e6)
