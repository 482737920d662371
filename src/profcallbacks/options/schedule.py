"""When to capture: torch.profiler's skip_first/wait/warmup/active/repeat schedule as plain data."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from profcallbacks.options.checks import check_int


class Phase(enum.Enum):
    """What the profiler does during one step."""

    IDLE = "idle"
    WARMUP = "warmup"
    ACTIVE = "active"


def _require(name: str, value: int, minimum: int, fix: str) -> None:
    check_int("Schedule", name, value, minimum=minimum, fix=fix)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Which steps to capture, with exactly the meaning of ``torch.profiler.schedule``.

    Steps are numbered from 0. The first ``skip_first`` steps are skipped, then each cycle is
    ``wait`` idle steps, ``warmup`` steps with the profiler started but discarding events, and
    ``active`` recorded steps. ``repeat`` cycles are run; ``repeat=0`` means forever (bounded by
    the profiler's ``max_captures``) and must be asked for explicitly.

    Example:
        >>> s = Schedule(skip_first=3, wait=2, warmup=1, active=4, repeat=2)
        >>> [step for step in range(20) if s.phase(step) is Phase.ACTIVE]
        [6, 7, 8, 9, 13, 14, 15, 16]
    """

    skip_first: int = 10
    wait: int = 0
    warmup: int = 1
    active: int = 3
    repeat: int = 1

    def __post_init__(self) -> None:
        _require("skip_first", self.skip_first, 0, "Use 0 to start capturing at the first step.")
        _require("wait", self.wait, 0, "Use 0 for no idle steps between captures.")
        _require("warmup", self.warmup, 0, "Use 1 (recommended) or 0 for no warmup.")
        _require("active", self.active, 1, "Use e.g. active=3 (a capture records at least 1 step).")
        _require("repeat", self.repeat, 0, "Use repeat=1 for one capture; repeat=0 means forever.")

    @property
    def cycle_length(self) -> int:
        """Steps in one wait + warmup + active cycle."""
        return self.wait + self.warmup + self.active

    def phase(self, step: int) -> Phase:
        """The phase of ``step`` (0-based)."""
        if step < self.skip_first:
            return Phase.IDLE
        offset = step - self.skip_first
        cycle, position = divmod(offset, self.cycle_length)
        if self.repeat and cycle >= self.repeat:
            return Phase.IDLE
        if position < self.wait:
            return Phase.IDLE
        if position < self.wait + self.warmup:
            return Phase.WARMUP
        return Phase.ACTIVE

    def next_window_start(self, step: int) -> int | None:
        """First step (warmup included) of the next window beginning at or after ``step``."""
        offset = max(step - self.skip_first, 0)
        cycle, position = divmod(offset, self.cycle_length)
        if position > self.wait:
            cycle += 1
        if self.repeat and cycle >= self.repeat:
            return None
        return self.skip_first + cycle * self.cycle_length + self.wait
