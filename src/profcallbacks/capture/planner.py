"""Which steps to capture next: the schedule plus on-demand triggers, as one state machine."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from profcallbacks.core.triggers import SCHEDULE, CaptureRequest
from profcallbacks.layout import capture_dir_name
from profcallbacks.options.bounds import MAX_CAPTURE_STEPS
from profcallbacks.options.schedule import Phase, Schedule

log = logging.getLogger(__name__)

NEVER = 1 << 62
"""A step number no run reaches."""


@dataclass(frozen=True)
class Window:
    """One capture: ``warmup`` steps from ``first_step``, then ``active`` recorded steps."""

    first_step: int
    warmup: int
    active: int
    trigger: str
    profile_memory: bool = False  # the trace records allocations too, whatever the options say

    @property
    def first_active(self) -> int:
        return self.first_step + self.warmup

    @property
    def last_step(self) -> int:
        return self.first_active + self.active - 1

    def dir_name(self, *, partial: bool = False) -> str:
        """Directory name: first captured step and trigger, e.g. ``step000120-schedule``."""
        return capture_dir_name(self.first_active, self.trigger, partial=partial)

    def phase(self, step: int) -> Phase:
        if self.first_step <= step < self.first_active:
            return Phase.WARMUP
        if self.first_active <= step <= self.last_step:
            return Phase.ACTIVE
        return Phase.IDLE


class CapturePlanner:
    """Decides, step by step, whether a capture window is running.

    Scheduled windows depend on the step number alone, so every rank agrees on them without
    talking. Requested windows start at the next step that is not already inside a window.

    Example:
        >>> planner = CapturePlanner(Schedule(skip_first=2, warmup=1, active=2), max_captures=5)
        >>> [planner.phase_for(step).value for step in range(6)]
        ['idle', 'idle', 'warmup', 'active', 'active', 'idle']
    """

    def __init__(self, schedule: Schedule | None, *, max_captures: int, warmup: int = 1) -> None:
        self._schedule = schedule
        self._max_captures = max_captures
        self._request_warmup = schedule.warmup if schedule else warmup
        self._pending: CaptureRequest | None = None
        self._limit_logged = False
        self.window: Window | None = None
        self.captures_started = 0
        self._skip_through = -1  # the scheduled steps a shortened window left out
        self._next_due = self._due_from(0)

    def request(self, active: int, trigger: str, *, profile_memory: bool = False) -> None:
        """Ask for a window of ``active`` recorded steps (at most ``MAX_CAPTURE_STEPS``) soon."""
        active = min(active, MAX_CAPTURE_STEPS)
        if self._pending is None or active > (self._pending.steps or 0):
            self._pending = CaptureRequest(trigger, active, profile_memory)

    def shorten(self, window: Window) -> None:
        """Record ``window`` (the current one with fewer active steps, e.g. to fit a byte
        budget) instead; the scheduled steps it leaves out are not captured later."""
        if self.window is not None and window != self.window:
            self._skip_through = max(self._skip_through, self.window.last_step)
            self.window = window

    @property
    def has_pending(self) -> bool:
        return self._pending is not None

    @property
    def next_due(self) -> int:
        """First step at which a scheduled window may begin (a huge number: never)."""
        return NEVER if self._next_due == float("inf") else int(self._next_due)

    def take_pending(self) -> CaptureRequest | None:
        """Remove and return the request not yet turned into a window."""
        request, self._pending = self._pending, None
        return request

    def phase_for(self, step: int) -> Phase:
        """Advance to ``step`` and return its phase, opening a new window when one is due."""
        if self.window is not None and step <= self.window.last_step:
            return self.window.phase(step)
        if self._pending is None and step < self._next_due:  # the common case: nothing due
            self.window = None
            return Phase.IDLE
        self.window = self._next_window(step)
        if self.window is None:
            self._next_due = self._due_from(step + 1)
            return Phase.IDLE
        return self.window.phase(step)

    def _due_from(self, step: int) -> float:
        """First step at or after ``step`` where a scheduled window may begin (inf: never)."""
        if self._schedule is None or self.captures_started >= self._max_captures:
            return float("inf")
        step = max(step, self._skip_through + 1)
        if self._schedule.phase(step) is not Phase.IDLE:
            return step
        start = self._schedule.next_window_start(step)
        return float("inf") if start is None else start

    def _next_window(self, step: int) -> Window | None:
        window = self._requested_window(step) or self._scheduled_window(step)
        if window is None:
            return None
        if self.captures_started >= self._max_captures:
            if not self._limit_logged:
                log.warning("profcallbacks: max_captures=%d reached; no more captures are taken "
                            "(raise max_captures to keep capturing).", self._max_captures)
                self._limit_logged = True
            self._pending = None
            return None
        self.captures_started += 1
        return window

    def _requested_window(self, step: int) -> Window | None:
        if self._pending is None:
            return None
        request, self._pending = self._pending, None
        return Window(step, self._request_warmup, request.steps or 1, request.trigger,
                      request.profile_memory)

    def _scheduled_window(self, step: int) -> Window | None:
        if (self._schedule is None or self._schedule.phase(step) is Phase.IDLE
                or step <= self._skip_through):
            return None
        s = self._schedule
        cycle_start = step - (step - s.skip_first) % s.cycle_length + s.wait
        window = Window(cycle_start, s.warmup, s.active, SCHEDULE)
        if step > window.first_active:  # joined mid-window (e.g. resumed): record what is left
            return Window(step, 0, window.last_step - step + 1, SCHEDULE)
        return window
