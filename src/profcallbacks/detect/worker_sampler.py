"""Where inside a loader worker the time goes: a low-rate sampler of the worker's main thread.

While the main process asks for it (``control[SAMPLING]``: a stall is open or a capture window
records), a daemon thread in each worker looks at the worker's main thread every
:data:`INTERVAL_S` (``sys._current_frames``) and counts the user's line it is in: the innermost
frame outside libraries, so the time inside ``PIL`` or ``torch`` counts for the line of the
user's dataset that called them (:class:`~profcallbacks.detect.frames.CallerFrames`, as the sync
audit names lines). Samples while the worker waits for its next index are not counted. Every
:data:`PUBLISH_S` the counts go to the worker's row of the shared memory as JSON
(``{"busy": samples, "phases": {...}, "lines": [[line, phase, samples], ...]}``).

Example:
    >>> hot_lines({"busy": 10, "lines": [["data.py:42 __getitem__", "fetch", 7]]})
    [('data.py:42 __getitem__', 'fetch', 0.7)]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any, Protocol

from profcallbacks.detect.frames import CallerFrames, location
from profcallbacks.detect.worker_ring import SAMPLING, WorkerRing

INTERVAL_S = 0.005
"""Seconds between two looks at the worker's main thread while sampling."""
IDLE_S = 0.05
"""Seconds between two looks at the main process's request while not sampling."""
PUBLISH_S = 0.25
"""Seconds between two publications of the counts."""
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
    control: Any  # the ring's control row
    phase: str  # idle, fetch, collate or send


def start_sampler(state: Sampled, thread_id: int) -> threading.Thread:
    """Start the sampler of the worker ``state`` over the thread ``thread_id``."""
    thread = threading.Thread(target=_run, args=(state, thread_id), daemon=True,
                              name="profcallbacks-worker-sampler")
    thread.start()
    return thread


def _run(state: Sampled, thread_id: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    frames = CallerFrames(LIBRARIES, plumbing=[os.path.join(here, "worker_hooks.py")])
    lines: Counter[tuple[str, str]] = Counter()
    phases: Counter[str] = Counter()
    busy = 0
    published = time.monotonic()
    changed = False
    try:
        while True:
            if not state.control[SAMPLING]:
                if changed:
                    _publish(state, busy, phases, lines)
                    changed = False
                time.sleep(IDLE_S)
                continue
            time.sleep(INTERVAL_S)
            phase = state.phase
            if phase == "idle":
                continue
            frame = sys._current_frames().get(thread_id)
            user = _user_frame(frames, frame)
            busy += 1
            phases[phase] += 1
            if user is not None:
                code = user.f_code
                lines[(f"{location(user)} {getattr(code, 'co_qualname', code.co_name)}",
                       phase)] += 1
            del frame, user
            changed = True
            now = time.monotonic()
            if now - published >= PUBLISH_S:
                _publish(state, busy, phases, lines)
                published, changed = now, False
    except Exception:  # the sampler never stops the worker: it stops itself
        return


def _user_frame(frames: CallerFrames, frame: FrameType | None) -> FrameType | None:
    """The innermost user frame inside torch's worker loop (the script that started the
    worker is outside it)."""
    while frame is not None and frame.f_code.co_name != WORKER_LOOP:
        if frames.kind(frame.f_code.co_filename) is None:
            return frame
        frame = frame.f_back
    return None


def _publish(state: Sampled, busy: int, phases: Counter[str],
             lines: Counter[tuple[str, str]]) -> None:
    top = [[line, phase, n] for (line, phase), n in lines.most_common(TOP_LINES)]
    state.ring.write_hot_lines(state.worker, {"busy": busy, "phases": dict(phases), "lines": top})


def hot_lines(sampled: dict[str, Any], least: float = 0.0) -> list[tuple[str, str, float]]:
    """``(line, phase, share of the busy samples)`` of a worker's published counts, largest
    first, those under ``least`` left out."""
    busy = sampled.get("busy") or 0
    if not busy:
        return []
    out = [(str(line), str(phase), n / busy) for line, phase, n in sampled.get("lines") or []]
    return [row for row in sorted(out, key=lambda r: -r[2]) if row[2] >= least]
