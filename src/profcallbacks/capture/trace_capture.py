"""One capture window: a torch.profiler that exists only between its warmup and its last step."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import profile

from profcallbacks.capture.planner import Window
from profcallbacks.core.capture_info import StepSpan
from profcallbacks.core.cpu_load import CpuLoad
from profcallbacks.options.trace import TraceOptions

log = logging.getLogger(__name__)


class TraceCapture:
    """Drives ``torch.profiler.profile`` through one window and remembers its step bounds.

    Created at the window's first step, gone after its last: outside windows nothing of the
    profiler stays installed.

    Example:
        >>> capture = TraceCapture(TraceOptions(), Window(0, 1, 2, "manual"))
        >>> capture.warm_up(); capture.record()        # doctest: +SKIP
        >>> profiler = capture.stop()                  # doctest: +SKIP
    """

    def __init__(self, options: TraceOptions, window: Window, *,
                 measure_first: bool = False) -> None:
        self.window = window
        self.options = options
        self._profiler: Any = profile(**options.profiler_kwargs())
        self._state = "created"
        self.spans: list[StepSpan] = []
        self.overlaps_export = False  # began while an earlier capture was still being exported
        self.measure_first = measure_first  # its first step is saved on its own, to be measured
        self.pieces: list[tuple[Path, int]] = []  # raw traces saved so far, and their bytes
        self.load = CpuLoad()  # how busy the machine was while it recorded

    @property
    def recording(self) -> bool:
        return self._state == "recording"

    def warm_up(self) -> None:
        """Start the profiler without keeping events (the window's warmup steps)."""
        if self._state == "created":
            if torch.autograd._profiler_enabled():
                raise RuntimeError("another torch.profiler is already running in this process "
                                   "(e.g. Trainer(profiler=...)); only one can record at a time")
            self._profiler.prepare_trace()
            self._state = "warm"

    def record(self) -> None:
        """Start keeping events (the window's first active step)."""
        self.warm_up()
        if self._state == "warm":
            self._profiler.start_trace()
            self._state = "recording"
            self.load.start()

    def cut(self) -> Any:
        """Stop the profiler after the first recorded step, to save that step on its own; the
        window goes on with :meth:`go_on`. Returns the stopped profiler."""
        assert self.recording, "cut() follows a recorded step"
        self.measure_first = False
        return self.stop()

    def go_on(self, options: TraceOptions, window: Window) -> None:
        """After :meth:`cut`: record the rest of ``window`` with ``options`` (a new profiler,
        started by the next ``record``)."""
        self.options, self.window = options, window
        self._profiler = profile(**options.profiler_kwargs())
        self._state = "created"

    def add_span(self, step: int, start_ns: int, end_ns: int) -> None:
        self.spans.append(StepSpan(step, start_ns, end_ns))
        self.load.mark()

    def cpu_figures(self) -> dict[str, Any] | None:
        """The machine's load while this capture recorded (``core.cpu_load``), or ``None``."""
        try:
            return self.load.figures(torch.get_num_threads())
        except Exception as exc:  # the figures are never worth the capture
            log.warning("profcallbacks: the capture's CPU load is left out (%s).", exc)
            return None

    def stop(self) -> Any | None:
        """Stop the profiler; returns it when it recorded anything, for export."""
        state, self._state = self._state, "stopped"
        if state == "created" or state == "stopped":
            return None
        if state == "warm":  # kineto stops cleanly only from a started trace
            self._profiler.start_trace()
        else:
            self.load.stop()
        self._profiler.stop_trace()
        return self._profiler if state == "recording" else None


wall_ns = time.time_ns
"""Wall-clock nanoseconds, the clock torch.profiler's trace timestamps are based on."""
