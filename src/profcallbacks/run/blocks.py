"""The block buffer: steps stored on the hot path, and how many make a block.

Detectors, summaries and triggers run once per block, not once per step, so the step itself
costs a clock read and a store. A block holds at most :data:`BLOCK_STEPS` steps and lasts about
:data:`BLOCK_S` seconds at the pace of the previous block (at least one step). A block's
boundary work stays on the thread that steps the session (:meth:`StepBuffer._from_another_thread`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from profcallbacks.options.profiler import ProfilerConfig

log = logging.getLogger(__name__)

BLOCK_STEPS = 128
"""Most steps in a block: detectors, summaries and triggers run once per block."""
BLOCK_S = 0.25
"""Target seconds per block: blocks of slow steps are shorter (at least one step). A shorter
``capture_file_poll_s`` or memory ``sample_every_s`` shortens blocks to that period."""
NO_WAITS = [0.0] * BLOCK_STEPS
"""A block's data waits before its steps wait (copied into the buffer when a block begins)."""


def block_period_s(config: ProfilerConfig) -> float:
    """Seconds a block may last: :data:`BLOCK_S`, or the period of anything polled between
    blocks if shorter (the CAPTURE file, memory samples)."""
    periods = [BLOCK_S]
    if config.watch_capture_file:
        periods.append(config.capture_file_poll_s)
    if config.memory is not None:
        periods.append(config.memory.sample_every_s)
    return min(periods)


def next_block_len(times: list[float], limit_s: float = BLOCK_S) -> int:
    """Steps in the next block: :data:`BLOCK_STEPS`, fewer when that would take over ``limit_s``
    at the pace of ``times`` (the last block's), its slowest step left out: one long step (a
    checkpoint, a log line) says nothing about the steps to come.

    Example:
        >>> next_block_len([0.001] * 10), next_block_len([0.01] * 10), next_block_len([0.5])
        (128, 25, 1)
        >>> next_block_len([0.001] * 9 + [0.2])  # one long step: the pace is still 1 ms
        128
    """
    n = len(times)
    seconds = sum(times) - max(times) if n > 1 else sum(times)
    steps = n - 1 if n > 1 else n
    if seconds <= 0:
        return BLOCK_STEPS
    return max(1, min(BLOCK_STEPS, int(limit_s * steps / seconds)))


class StepBuffer:
    """The hot path: each step's end and data wait stored into the block's buffer.

    ``_ends[0]`` is when the block's first step began, ``_ends[k]`` when its ``k``-th step ended
    (stored by :meth:`step_end`); ``_waits[k]`` that step's data wait (added to by
    :meth:`data_wait` and :meth:`batch_arrived`, zeroed when a block begins). When the block
    is due, :meth:`step_end` calls ``_block_boundary`` (the session's).
    """

    def __init__(self, clock: Callable[[], float], start_step: int, block_s: float = BLOCK_S) -> None:
        self._clock = clock
        self._step_clock = clock  # read by step_end(); on CUDA it also marks the step's event
        self._ends = [0.0] * (BLOCK_STEPS + 1)
        self._waits = [0.0] * (BLOCK_STEPS + 1)
        self._n = 0  # steps in the block so far
        self._due = 0  # step_end() takes the slow path when _n reaches this (0: not open)
        self._first = start_step  # number of the block's first step
        self._wait_from = 0.0
        self._block_excluded = False  # the block's steps are left out of the statistics
        self._block_after_pause = True  # the block's first step follows a start or a pause
        self._block_len = 1  # the first block is one step: then the step rate is known
        self._block_s = block_s  # seconds a block may last (block_period_s)
        self._stepper: threading.Thread | None = None  # the thread that steps (its boundaries)
        self._warned_threads = False

    @property
    def step(self) -> int:
        """Number of the step in progress (steps are numbered from ``start_step``)."""
        return self._first + self._n

    def data_wait(self, seconds: float) -> None:
        """Add ``seconds`` spent waiting for a batch of the current step."""
        self._waits[self._n + 1] += seconds  # the current step's slot: step_end() stores none

    def batch_arrived(self) -> None:
        """A batch of the current step is in hand (for front ends with hooks, not iterators).

        The time since the step began, or since the last ``batch_done()``, counts as data wait.
        """
        began = self._ends[self._n]
        self._waits[self._n + 1] += (self._clock()
                                     - (began if began > self._wait_from else self._wait_from))

    def batch_done(self) -> None:
        """A micro-batch of the current step is done; waiting for the next one starts now."""
        self._wait_from = self._clock()

    def step_end(self) -> None:
        """The current optimizer step is complete.

        The hot path: a clock read, a store into the block buffer and one comparison. Everything
        else (participants, summaries) runs in ``_block_boundary`` once per block. On CUDA the
        clock read also records the step's CUDA event (``core.device_timing.DeviceClock``).
        """
        now = self._step_clock()
        n = self._n + 1
        self._n = n
        self._ends[n] = now
        if n >= self._due:
            self._block_boundary(now)

    def _block_boundary(self, now: float) -> None:
        raise NotImplementedError

    def _from_another_thread(self) -> bool:
        """Whether this block boundary is reached on a thread other than the one stepping the
        session (the first to reach one, while it lives): that thread's boundary work (the
        profiler's windows, kineto's export) is left to it, so it never runs on two threads at
        once. The block stays due; this step is not counted once the block buffer is full.
        Warns once."""
        current = threading.current_thread()
        owner = self._stepper
        if owner is None or owner is current or not owner.is_alive():
            self._stepper = current
            return False
        if not self._warned_threads:
            self._warned_threads = True
            log.warning("profcallbacks: step() is called from thread %r while thread %r steps "
                        "this profiler; its capture windows and summaries stay on %r (steps of "
                        "other threads are counted between its steps). Call step() from one "
                        "thread, the one that runs the optimizer step.", current.name,
                        owner.name, owner.name)
        if self._n >= BLOCK_STEPS:
            self._n -= 1  # the buffer is full until the stepping thread comes back
        return True
