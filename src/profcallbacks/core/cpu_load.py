"""How busy the machine was while a capture recorded: CPU time against wall time, the time this
process's threads waited for a core, CPU pressure and the run queue.

A trace shows slow operators, not why: two intra-op threads on a machine whose other core is held
by another job make every operator slower, and only the scheduler's counters say so. One reading
when a capture starts recording and one at the end of each recorded step are all it takes; each
reads a few small ``/proc`` files (Linux: one per thread, ~30 us for a handful of threads), and anywhere else,
or on any error, a reading is ``None`` and the capture carries no load figures.

Example:
    >>> load = CpuLoad()
    >>> load.start(); load.mark(); load.stop()
    >>> figures = load.figures(threads=2)  # None off Linux
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from profcallbacks.core.cpus import usable_cpus

_TASKS = "/proc/self/task"
_PRESSURE = "/proc/pressure/cpu"
_LOADAVG = "/proc/loadavg"


@dataclass(frozen=True)
class CpuReading:
    """Counters at one moment, in seconds since an arbitrary origin."""

    wall_s: float
    cpu_s: float  # on-CPU time of every thread of this process
    run_delay_s: float  # time this process's threads were runnable but waited for a core
    pressure_s: float | None  # /proc/pressure/cpu "some": time any task of the machine waited


def read_cpu() -> CpuReading | None:
    """The counters now, or ``None`` where ``/proc`` does not give them (macOS, Windows, a
    kernel without schedstat)."""
    try:
        delay = 0
        for task in os.listdir(_TASKS):
            try:
                with open(f"{_TASKS}/{task}/schedstat", "rb", buffering=0) as f:
                    delay += int(f.read().split()[1])
            except OSError:  # the thread ended between the listing and the read
                continue
        # the process's CPU clock is exact; a thread's schedstat counts its time on a CPU only
        # at scheduler ticks, too coarse for a step of a few ms
        return CpuReading(time.perf_counter(), time.process_time(), delay / 1e9, _pressure_s())
    except (OSError, ValueError, IndexError):
        return None


def _first_line(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read(256).split(b"\n", 1)[0]


def _pressure_s() -> float | None:
    try:
        return int(_first_line(_PRESSURE).rsplit(b"total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def run_queue() -> int | None:
    """Runnable tasks on the machine now (``/proc/loadavg``), this process's included."""
    try:
        return int(_first_line(_LOADAVG).split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


MAX_STEPS = 1000
"""Steps whose figures a capture keeps (as many as a capture window may hold)."""


class CpuLoad:
    """The counters' change over each recorded step: :meth:`start` when the capture starts
    recording, :meth:`mark` at each step's end, :meth:`stop` when it stops (a capture may stop
    and start again, e.g. when its first step is saved on its own)."""

    def __init__(self) -> None:
        self._last: CpuReading | None = None
        self._steps: list[tuple[float, float, float, float | None]] = []
        self._queue: int | None = None

    def start(self) -> None:
        """Take the opening reading (a no-op off Linux)."""
        self._last = read_cpu()

    def mark(self) -> None:
        """A recorded step ended: keep its figures, and start the next step's."""
        opened = self._last
        if opened is None or len(self._steps) >= MAX_STEPS:
            return
        self._last = closed = read_cpu()
        if closed is None:
            return
        pressure = (None if opened.pressure_s is None or closed.pressure_s is None
                    else closed.pressure_s - opened.pressure_s)
        self._steps.append((closed.wall_s - opened.wall_s, closed.cpu_s - opened.cpu_s,
                            closed.run_delay_s - opened.run_delay_s, pressure))
        self._queue = run_queue()

    def stop(self) -> None:
        """Recording stopped: what follows until the next :meth:`start` is no step."""
        self._last = None

    def figures(self, threads: int | None) -> dict[str, Any] | None:
        """What the capture's trace carries (``profcallbacks.cpu``); ``None`` when nothing was
        read.

        ``steps`` holds one ``[wall, cpu, run delay, pressure]`` row per recorded step, in ms
        (pressure ``None`` where the kernel gives none).

        Args:
            threads: The intra-op threads the step ran with (``torch.get_num_threads()``).
        """
        if not self._steps:
            return None
        rows = [[round(wall * 1e3, 3), round(cpu * 1e3, 3), round(delay * 1e3, 3),
                 None if pressure is None else round(pressure * 1e3, 3)]
                for wall, cpu, delay, pressure in self._steps]
        return {"steps": rows, "run_queue": self._queue, "threads": threads,
                "cpus": usable_cpus()}
