"""Predicts a capture's bytes on disk from what the run recorded, and trims it to its budget.

A capture's size is its steps times its bytes per step, and bytes per step depend on the options
that make events larger (``with_stack`` adds Python frames to every operator, ``record_shapes``
and ``profile_memory`` add arguments and allocation events). The sizer learns bytes per step for
each combination of those options from the run's own earlier captures (raw trace bytes measured
when kineto saved them, times the gzip ratio the exporter achieved), or from the first capture's
first step, saved on its own, when the run has none. Before a window records (the rest of the
first one) it trims, in this order, until the prediction fits:

1. fewer active steps (down to one);
2. ``with_stack`` off;
3. ``record_shapes`` off;
4. ``profile_memory`` off (never for a ``memory`` capture: allocations are what it is for).

After each option turned off the steps are tried again from the full count. A trace is never cut
mid-way: what is recorded is written whole, and one that still comes out over its budget (the
model changed) is kept and marked, and its size trims the next capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from profcallbacks.core.triggers import MEMORY
from profcallbacks.options.trace import TraceOptions

TRIM_OPTIONS = ("with_stack", "record_shapes", "profile_memory")
"""Options turned off, in this order, once one active step does not fit."""
OPTION_WEIGHT = {"with_stack": 1.5, "record_shapes": 1.25, "profile_memory": 1.15}
"""Prior factor by which each option multiplies bytes per step, until the run measured both: low
(measured 1.7, 1.36 and 1.17 on a small CPU model; more with deep Python stacks), so a trim is
expected to save less than it does and the trimmed capture fits."""
GZIP_RATIO = 0.12
"""Prior gzipped/raw size ratio of a trace (kineto JSON compresses ~8-17x at level 1)."""
FILL = 0.9
"""Share of the budget a prediction may fill: steps are not all alike."""

OptionKey = tuple[bool, bool, bool]


def option_key(options: TraceOptions) -> OptionKey:
    return (options.with_stack, options.record_shapes, options.profile_memory)


@dataclass(frozen=True)
class Trim:
    """What a capture records after its budget was applied, and why."""

    options: TraceOptions
    active: int
    requested_active: int
    predicted_bytes: int | None
    trimmed: tuple[str, ...] = ()
    reason: str = ""

    def metadata(self, budget_bytes: int, first_step_bytes: float | None) -> dict[str, Any]:
        """The ``budget`` block of the capture's trace metadata."""
        return {"capture_bytes": budget_bytes, "predicted_bytes": self.predicted_bytes,
                "requested_active_steps": self.requested_active, "active_steps": self.active,
                "trimmed": list(self.trimmed), "reason": self.reason,
                "first_step_bytes": None if first_step_bytes is None
                else round(first_step_bytes)}


class CaptureSizer:
    """Learns bytes per step per option set and trims windows to ``capture_bytes``.

    Example:
        >>> sizer = CaptureSizer(1_000_000)
        >>> sizer.record_raw(TraceOptions(), steps=2, raw_bytes=4_000_000)  # ~240 kB a step gzipped
        >>> sizer.plan(TraceOptions(), 5, trigger="schedule").active
        3
    """

    def __init__(self, capture_bytes: int) -> None:
        self.capture_bytes = capture_bytes
        self._raw_per_step: dict[OptionKey, float] = {}
        self._ratio: float | None = None

    @property
    def knows_nothing(self) -> bool:
        """No capture of this run has been measured yet (its first step will tell)."""
        return not self._raw_per_step

    def record_raw(self, options: TraceOptions, *, steps: int, raw_bytes: int) -> None:
        """A capture of ``steps`` steps with ``options`` saved ``raw_bytes`` of trace JSON."""
        if steps > 0 and raw_bytes > 0:
            self._raw_per_step[option_key(options)] = raw_bytes / steps

    def record_disk(self, *, raw_bytes: int, disk_bytes: int) -> None:
        """A raw trace of ``raw_bytes`` took ``disk_bytes`` once written (gzipped)."""
        if raw_bytes > 0 and disk_bytes > 0:
            self._ratio = disk_bytes / raw_bytes

    def per_step(self, options: TraceOptions) -> float | None:
        """Predicted on-disk bytes of one step recorded with ``options`` (``None``: unknown)."""
        raw = self._raw_per_step
        key = option_key(options)
        if key in raw:
            per_step = raw[key]
        elif raw:
            nearest = min(raw, key=lambda k: sum(a != b for a, b in zip(k, key, strict=True)))
            per_step = raw[nearest] * _weight(key) / _weight(nearest)
        else:
            return None
        return per_step * (self._ratio if self._ratio is not None else GZIP_RATIO)

    def plan(self, options: TraceOptions, active: int, *, trigger: str,
             most: int | None = None) -> Trim:
        """The window's options and steps, trimmed so its prediction fits the budget.

        Args:
            options: The options the window would record with.
            active: The steps it would record.
            trigger: What opened it (a ``memory`` capture keeps ``profile_memory``).
            most: The most steps it can still record, if fewer than ``active``.
        """
        if self.per_step(options) is None:
            return Trim(options, active, active, None, reason="no earlier capture to predict from")
        most = active if most is None else most
        room = self.capture_bytes * FILL
        trimmed: list[str] = []
        current = options
        candidates = [current]
        for name in TRIM_OPTIONS:
            if getattr(current, name) and not (name == "profile_memory" and trigger == MEMORY):
                flags: dict[str, Any] = {name: False}
                current = replace(current, **flags)
                candidates.append(current)
        for candidate in candidates:
            per_step = self.per_step(candidate) or 0.0
            steps = min(most, math.floor(room / per_step)) if per_step > 0 else most
            if steps >= 1 or candidate is candidates[-1]:
                steps = max(steps, 1)
                trimmed = [f"{name} off" for name in TRIM_OPTIONS
                           if getattr(options, name) and not getattr(candidate, name)]
                if steps < active:
                    trimmed.insert(0, f"active steps {active} -> {steps}")
                predicted = round(per_step * steps)
                reason = (f"predicted {_mb(per_step * active)} for {active} step(s) with the "
                          f"options asked for, over the budget of {_mb(self.capture_bytes)}"
                          if trimmed else "")
                if predicted > self.capture_bytes:
                    reason += "; still over after every trim (kept, and marked if it is)"
                return Trim(candidate, steps, active, predicted, tuple(trimmed), reason)
        raise AssertionError("unreachable: the last candidate always returns")


def _weight(key: OptionKey) -> float:
    return math.prod(OPTION_WEIGHT[name] for name, on in zip(TRIM_OPTIONS, key, strict=True) if on)


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f} MB"
