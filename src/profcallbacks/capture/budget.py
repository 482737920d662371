"""The capture byte budget at window boundaries: a size probe, the trim, and what it learned.

The controller asks :meth:`CaptureBudget.before_window` when a window is about to record. With no
earlier capture to predict from, a window with a warmup step records that step once as a *probe*
(a profiler of its own, saved and measured, then deleted) and the real profiler starts at the
next step. Each capture's raw size (known as soon as kineto saved it) and, once published, its
size on disk feed the prediction of the next one (``trimming.CaptureSizer``).
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch.profiler import profile

from profcallbacks.capture.planner import Window
from profcallbacks.capture.trace_writer import GZIP_LEVEL, RAW_DIR_PREFIX, RAW_FILE, remove_raw
from profcallbacks.capture.trimming import CaptureSizer, Trim
from profcallbacks.core.safefs import ensure_dir, make_private_dir, read_regular
from profcallbacks.layout import STAGING_DIR
from profcallbacks.options.trace import TraceOptions

log = logging.getLogger(__name__)

MAX_PROBE_BYTES = 1 << 31
"""Largest one-step probe trace read back (2 GiB); a larger one is not measured."""


class CaptureBudget:
    """Trims each window to ``capture_bytes`` and learns from each capture written.

    Example:
        >>> budget = CaptureBudget(5_000_000, Path("runs/x"))
        >>> budget.before_window(Window(0, 1, 3, "schedule"), TraceOptions(), warmup=True) is None
        True
    """

    def __init__(self, capture_bytes: int, logdir: Path) -> None:
        self.sizer = CaptureSizer(capture_bytes)
        self._logdir = logdir
        self._probe: Any | None = None  # a torch.profiler.profile recording one step
        self._probe_options: TraceOptions | None = None
        self._probe_per_step: float | None = None
        self._probed: Window | None = None
        self._trims: dict[Window, Trim] = {}
        self._unmeasured: dict[str, tuple[int, str]] = {}  # capture name -> raw bytes, file name

    @property
    def probing(self) -> bool:
        """A probe profiler records the current step."""
        return self._probe is not None

    def before_window(self, window: Window, options: TraceOptions, *,
                      warmup: bool) -> tuple[Window, TraceOptions] | None:
        """The window and options to record with, or ``None`` while a probe records this step.

        Args:
            window: The window about to record (or warm up) at this step.
            options: The options it would record with untrimmed.
            warmup: This step is one of the window's warmup steps.
        """
        if self._probe is not None:
            self._finish_probe()
        elif self.sizer.knows_nothing and warmup and self._probed != window:
            self._probed = window
            if self._start_probe(options):
                return None
        trim = self.sizer.plan(options, window.active, trigger=window.trigger)
        trimmed = replace(window, active=trim.active)
        self._trims[trimmed] = trim
        if trim.trimmed:
            log.info("profcallbacks: capture %s trimmed to its budget of %.1f MB: %s (%s).",
                     trimmed.dir_name(), self.sizer.capture_bytes / 1e6, ", ".join(trim.trimmed),
                     trim.reason)
        return trimmed, trim.options

    def metadata(self, window: Window) -> dict[str, Any] | None:
        """The ``budget`` block for the capture of ``window`` (``None`` when it was not planned)."""
        trim = self._trims.pop(window, None)
        if trim is None:
            return None
        return trim.metadata(self.sizer.capture_bytes, self._probe_per_step)

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

    def close(self) -> None:
        """Stop a probe still recording (the run ended in a warmup step)."""
        probe, self._probe = self._probe, None
        if probe is not None:
            with contextlib.suppress(Exception):
                probe.stop()

    def _start_probe(self, options: TraceOptions) -> bool:
        try:
            probe = profile(**options.profiler_kwargs())
            probe.start()
        except Exception as exc:  # e.g. another profiler runs: no probe, no prediction yet
            log.info("profcallbacks: no size probe (%s); the first capture is not trimmed.", exc)
            return False
        self._probe, self._probe_options = probe, options
        return True

    def _finish_probe(self) -> None:
        probe, self._probe = self._probe, None
        assert probe is not None and self._probe_options is not None
        path: Path | None = None
        try:
            probe.stop()
            staging = self._logdir / STAGING_DIR
            ensure_dir(staging, own=True)  # kineto saves by path: in a private directory
            path = make_private_dir(staging, f"{RAW_DIR_PREFIX}size-probe-") / RAW_FILE
            probe.export_chrome_trace(str(path))
            data = read_regular(path, max_bytes=MAX_PROBE_BYTES)
            size, disk = len(data), len(zlib.compress(data, GZIP_LEVEL))  # one step: ~ms
        except Exception as exc:
            log.info("profcallbacks: the size probe failed (%s); the first capture is not "
                     "trimmed.", exc)
            return
        finally:
            if path is not None:
                remove_raw(path)
            with contextlib.suppress(Exception):
                probe.profiler = None  # free its events now, not in a later training step
        self.sizer.record_raw(self._probe_options, steps=1, raw_bytes=size)
        self.sizer.record_disk(raw_bytes=size, disk_bytes=disk)
        per_step = self.sizer.per_step(self._probe_options)
        self._probe_per_step = per_step
        log.info("profcallbacks: size probe: %.0f kB per step on disk predicted.",
                 (per_step or 0) / 1e3)
