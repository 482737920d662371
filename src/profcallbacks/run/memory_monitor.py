"""The session's memory work: samples at step summaries, creep alerts, sites of a memory capture.

The session calls :meth:`MemoryMonitor.sample` where it publishes a step summary and
:meth:`MemoryMonitor.window_step` at step boundaries only while a capture is open or sites are
pending, so steps outside those pay nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from profcallbacks.capture.trace_capture import TraceCapture
from profcallbacks.core.safefs import make_private_dir, remove_own_tree
from profcallbacks.core.triggers import MEMORY
from profcallbacks.detect.memory import (
    CUDA_ALLOCATED,
    PROCESS_RSS,
    MemoryCreepDetector,
    cuda_total_mb,
    read_cuda_mb,
    read_rss_mb,
)
from profcallbacks.detect.memory_sites import MemorySiteSpy, describe_sites
from profcallbacks.findings import MEMORY_SITES, OUT_OF_MEMORY, Finding
from profcallbacks.layout import memory_snapshot_file
from profcallbacks.options.memory import MemoryConfig

log = logging.getLogger(__name__)

TRIGGER = MEMORY
"""Trigger (and capture directory suffix) of the capture a ``memory_creep`` alert asks for."""
SNAPSHOT_ENTRIES = 100_000  # allocator events kept by the CUDA memory history of one capture


class MemoryMonitor:
    """Reads memory numbers, runs the creep detector and turns a memory capture into sites.

    Example:
        >>> monitor = MemoryMonitor(MemoryConfig(sample_every_s=0), Path("runs/x"), rank=0)
        >>> values, findings = monitor.sample(step=49, now=0.0)
        >>> "process_rss_mb" in values
        True
    """

    def __init__(self, config: MemoryConfig, logdir: Path, *, rank: int) -> None:
        self.config = config
        self._logdir = logdir
        self._rank = rank
        self._detector: MemoryCreepDetector | None = None
        self._next_sample = float("-inf")
        self.last: dict[str, float] = {}
        self.sites: list[dict[str, Any]] = []
        self._spy: MemorySiteSpy | None = None
        self._finished: MemorySiteSpy | None = None  # spy of the last capture, to be judged
        self._capture_name = ""
        self._capture_step = 0
        self._snapshot: Path | None = None
        self._due: int | None = None  # step at which the captured allocations are judged
        self._broken = False

    @property
    def busy(self) -> bool:
        """A memory capture is recording, or its allocations wait to be judged."""
        return self._spy is not None or self._due is not None

    def sample(self, step: int, now: float) -> tuple[dict[str, float], list[Finding]]:
        """Memory numbers (``memory_*_mb``, ``process_rss_mb``) and findings; rate-limited."""
        if now < self._next_sample:
            return {}, []
        self._next_sample = now + self.config.sample_every_s
        values = read_cuda_mb()
        rss = read_rss_mb()
        if rss is not None:
            values["process_rss_mb"] = rss
        self.last = values
        if self._detector is None:
            cuda = "memory_allocated_mb" in values
            self._detector = MemoryCreepDetector(
                self.config, rank=self._rank, source=CUDA_ALLOCATED if cuda else PROCESS_RSS,
                total_mb=cuda_total_mb() if cuda else None)
        key = "memory_allocated_mb" if self._detector.source == CUDA_ALLOCATED else "process_rss_mb"
        if key not in values:
            return values, []
        return values, self._detector.observe(step, values[key], now)

    def window_step(self, step: int, capture: TraceCapture | None) -> list[Finding]:
        """Step ``step`` begins with ``capture`` open (or none): start, stop or judge the spy."""
        if self._broken:
            return []
        try:
            return self._window_step(step, capture)
        except Exception as exc:  # the memory capture never stops training
            log.warning("profcallbacks: the memory capture failed at step %d (%s: %s); it is off.",
                        step, type(exc).__name__, exc)
            self._broken = True
            self.close()
            return []

    def _window_step(self, step: int, capture: TraceCapture | None) -> list[Finding]:
        recording = capture is not None and capture.window.trigger == TRIGGER and capture.recording
        if recording:  # named at each step: a byte budget may move its first step
            assert capture is not None
            self._capture_name = capture.window.dir_name()
            self._capture_step = capture.window.first_active
        if self._spy is None and recording and self._due is None:
            self._start_cuda_history()
            try:
                self._spy = MemorySiteSpy().__enter__()
            except Exception:
                self._stop_cuda_history()  # never left recording for the rest of the run
                raise
        elif self._spy is not None and not recording:
            self._stop_spy()
            self._due = step + self.config.hold_steps
        if self._due is not None and step >= self._due:
            self._due = None
            return [self._sites_finding(step)]
        return []

    def _stop_spy(self) -> None:
        spy, self._spy = self._spy, None
        if spy is not None:
            spy.__exit__(None, None, None)
            self._finished = spy
        self._snapshot = self._dump_cuda_history()

    def _sites_finding(self, step: int) -> Finding:
        spy, self._finished = self._finished, None
        self.sites = spy.alive_sites(self.config.max_sites) if spy is not None else []
        details: dict[str, Any] = {"sites": self.sites, "capture": self._capture_name,
                                   "hold_steps": self.config.hold_steps}
        if self.sites:
            message = (f"memory allocated during capture {self._capture_name} and still alive "
                       f"{self.config.hold_steps} steps later: {describe_sites(self.sites)}")
        else:
            message = (f"no allocation made during capture {self._capture_name} is still alive "
                       f"{self.config.hold_steps} steps later")
        if self._snapshot is not None:
            details["snapshot"] = str(self._snapshot)
            message += (f". CUDA memory snapshot: {self._snapshot} (python -m "
                        f"torch.cuda._memory_viz trace_plot {self._snapshot} -o memory.html, "
                        "or drop it on https://pytorch.org/memory_viz)")
        return Finding(MEMORY_SITES, step, self._rank, "warning", message + ".", details)

    def out_of_memory(self, step: int, error: BaseException) -> Finding | None:
        """The ``out_of_memory`` finding for ``error`` if it is one, with the last numbers."""
        if not _is_oom(error):
            return None
        try:
            values = read_cuda_mb()
            rss = read_rss_mb()
            if rss is not None:
                values["process_rss_mb"] = rss
        except Exception:  # after an OOM even reading may fail: keep the last sample
            values = {}
        memory = {k: round(v, 1) for k, v in (values or self.last).items()}
        details: dict[str, Any] = {"error": f"{type(error).__name__}: {error}"[:500],
                                   "memory": memory, "sites": self.sites}
        numbers = ", ".join(f"{k} {v:,.0f}" for k, v in memory.items()) or "no numbers"
        message = f"out of memory at step {step} ({numbers})"
        if self.sites:
            message += f"; memory kept by {describe_sites(self.sites)}"
        return Finding(OUT_OF_MEMORY, step, self._rank, "error", message + ".", details)

    def close(self) -> None:
        """Leave the spy and the CUDA memory history (at the end of the run or on an error)."""
        if self._spy is not None:
            try:
                self._spy.__exit__(None, None, None)
            finally:
                self._spy = None
                self._stop_cuda_history()
        self._due = None
        self._finished = None

    def _start_cuda_history(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)

    def _dump_cuda_history(self) -> Path | None:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        path = memory_snapshot_file(self._logdir, self._rank, self._capture_step)
        private = make_private_dir(path.parent, ".memory-")  # torch writes by path: never
        try:  # through a link planted under the snapshot's predictable name
            torch.cuda.memory._dump_snapshot(str(private / path.name))
            os.replace(private / path.name, path)  # replaces a planted link, not its target
        finally:
            self._stop_cuda_history()
            remove_own_tree(private, inside=path.parent)
        return path

    def _stop_cuda_history(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.memory._record_memory_history(enabled=None)


def _is_oom(error: BaseException) -> bool:
    import torch

    return isinstance(error, (MemoryError, torch.OutOfMemoryError))
