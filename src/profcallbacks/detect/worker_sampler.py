"""Where inside a loader worker the time goes: a low-rate sampler of the worker's main thread.

While the main process asks for it (``control[SAMPLING]``: a stall is open, or the loop waits
for data at least the stall's ``share_threshold`` of its time; not in capture windows otherwise),
each worker samples its own main thread every :data:`INTERVAL_S` of the CPU time it
uses (``SIGPROF`` from ``setitimer(ITIMER_PROF)``: the handler runs on that thread between two
bytecodes, so there is no second thread to take the GIL, and a worker waiting for its next index
uses no CPU and is never sampled). Each sample counts the user's line the thread is in: the
innermost frame outside libraries, so the time inside ``PIL`` or ``torch`` counts for the line of
the user's dataset that called them (:class:`~profcallbacks.detect.frames.CallerFrames`, as the
sync audit names lines). Every :data:`PUBLISH_S` the counts go to the worker's row of the shared
memory as JSON, and at the 1st, 2nd, 4th... sample
(``{"busy": samples, "phases": {...}, "lines": [[line, phase, samples], ...]}``).
A worker whose ``SIGPROF`` is already taken (another profiler) is not sampled.

Example:
    >>> hot_lines({"busy": 10, "lines": [["data.py:42 __getitem__", "fetch", 7]]})
    [('data.py:42 __getitem__', 'fetch', 0.7)]
"""

from __future__ import annotations

import atexit
import signal
import time
from collections import Counter
from types import CodeType, FrameType
from typing import Any, Protocol

from profcallbacks.detect.frames import CallerFrames, display_path
from profcallbacks.detect.worker_ring import SAMPLING, WorkerRing

INTERVAL_S = 0.02
"""Seconds of the worker's CPU time between two samples while sampling."""
PUBLISH_S = 0.25
"""Seconds between two publications of the counts (and at the 1st, 2nd, 4th... sample)."""
TOP_LINES = 20
"""Lines published per worker."""
WORKER_LOOP = "_worker_loop"
"""torch's worker loop: the frames outside it are the starting script's, not the dataset's."""
LIBRARIES = ("torch", "numpy", "profcallbacks")
"""Packages whose frames are folded into the user's line that called them (besides everything
in site-packages and the standard library)."""


class Sampled(Protocol):
    """What the sampler reads of a worker's timing state."""

    ring: WorkerRing
    worker: int
    phase: str  # idle, fetch, collate or send


class StackSampler:
    """The ``SIGPROF`` sampler of one worker (see the module docstring); :meth:`update` arms or
    disarms it as the main process asks (the worker's hooks call it once per batch).

    Args:
        state: The worker's timing state.
        plumbing: Files looked through as well (the hooks' own module).
    """

    def __init__(self, state: Sampled, plumbing: list[str]) -> None:
        self.state = state
        self.frames = CallerFrames(LIBRARIES, plumbing=plumbing)
        self.lines: Counter[tuple[CodeType, int, str]] = Counter()
        self.phases: Counter[str] = Counter()
        self.busy = 0
        self.armed = False
        self.published = time.monotonic()
        self.control = memoryview(state.ring.control).cast("B").cast("d")
        if signal.getsignal(signal.SIGPROF) not in (signal.SIG_DFL, None):
            raise RuntimeError("SIGPROF is taken")
        signal.signal(signal.SIGPROF, self._sample)
        atexit.register(self.stop)  # a spawned worker finalises: SIGPROF must not kill it then

    def stop(self) -> None:
        """Disarm the timer for good and ignore a ``SIGPROF`` still on its way."""
        signal.setitimer(signal.ITIMER_PROF, 0.0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)

    def update(self) -> None:
        """Arm the timer while the main process asks for samples; publish when it stops."""
        wanted = bool(self.control[SAMPLING])
        if wanted == self.armed:
            return
        self.armed = wanted
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S if wanted else 0.0, INTERVAL_S)
        if not wanted:
            self._publish()

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        try:
            phase = self.state.phase
            if phase == "idle":
                return
            self.busy += 1
            self.phases[phase] += 1
            user = _user_frame(self.frames, frame)
            if user is not None:  # named when published: a sample only counts
                self.lines[(user.f_code, user.f_lineno, phase)] += 1
            now = time.monotonic()
            if now - self.published >= PUBLISH_S or not self.busy & (self.busy - 1):
                # and at the 1st, 2nd, 4th, 8th... sample: a stall's finding, made soon after
                # sampling began, has the first counts
                self._publish()
                self.published = now
        except Exception:  # never raise into the dataset's code
            return

    def _publish(self) -> None:
        top = [[f"{display_path(code.co_filename)}:{line} "
                f"{getattr(code, 'co_qualname', code.co_name)}", phase, n]
               for (code, line, phase), n in self.lines.most_common(TOP_LINES)]
        self.state.ring.write_hot_lines(self.state.worker, {
            "busy": self.busy, "phases": dict(self.phases), "lines": top})


def _user_frame(frames: CallerFrames, frame: FrameType | None) -> FrameType | None:
    """The innermost user frame inside torch's worker loop (the script that started the
    worker is outside it)."""
    while frame is not None and frame.f_code.co_name != WORKER_LOOP:
        if frames.kind(frame.f_code.co_filename) is None:
            return frame
        frame = frame.f_back
    return None


def hot_lines(sampled: dict[str, Any], least: float = 0.0) -> list[tuple[str, str, float]]:
    """``(line, phase, share of the busy samples)`` of a worker's published counts, largest
    first, those under ``least`` left out."""
    busy = sampled.get("busy") or 0
    if not busy:
        return []
    out = [(str(line), str(phase), n / busy) for line, phase, n in sampled.get("lines") or []]
    return [row for row in sorted(out, key=lambda r: -r[2]) if row[2] >= least]
