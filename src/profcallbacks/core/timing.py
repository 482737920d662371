"""Always-on step timing in bounded memory."""

from __future__ import annotations

import warnings
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from profcallbacks.options.bounds import MAX_SUMMARY_STEPS, SUMMARY_MIN_S

__all__ = ["MAX_SUMMARY_STEPS", "SUMMARY_MIN_S", "IntervalSummary", "StepRecord", "StepTimes", "median"]

def median(values: Iterable[float]) -> float:
    """Median of ``values`` (not empty); plain ``sorted``, cheaper than ``statistics.median``."""
    ordered = sorted(values)
    n, mid = len(ordered), len(ordered) // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class StepRecord(NamedTuple):
    """Timing of one finished optimizer step.

    Args:
        step: Step number (0-based).
        step_time_s: Wall time of the step in seconds, data wait included, pauses excluded.
        data_wait_s: Seconds spent waiting for the step's batches.
        excluded: The step's time is not the job's own, so it is left out of the run's
            statistics and of every detector's (a *counted* step is one that is not): it ran with
            a profiler attached (warmup or active), under the sync audit, while torch.compile
            compiled, or while a capture was exported on a thread of this process (the fallback
            when no helper process could start).
        after_pause: The step followed a pause (validation, checkpoint) or the start of training.

    A ``NamedTuple`` rather than a dataclass: one is made per step, and this is the cheapest.

    Example:
        >>> record = StepRecord(7, 0.02, 0.001, excluded=True)
        >>> record.excluded, record.after_pause
        (True, False)
    """

    step: int
    step_time_s: float
    data_wait_s: float
    excluded: bool = False
    after_pause: bool = False

    @property
    def captured(self) -> bool:
        """Deprecated: the name ``excluded`` had in 0.2 (a ``DeprecationWarning``; removed in 0.4)."""
        warnings.warn("StepRecord.captured is deprecated since 0.3 and will be removed in 0.4; "
                      "read StepRecord.excluded (the same value: the step is left out of the "
                      "statistics).", DeprecationWarning, stacklevel=2)
        return self.excluded


@dataclass(frozen=True)
class IntervalSummary:
    """Aggregate of the steps since the last summary (what scalars and the steps file hold).

    The ``step_time_ms_*`` and ``data_wait_ms_mean`` fields cover every step of the interval;
    ``counted_us`` lists the step times (whole microseconds) of the counted steps (those not
    ``StepRecord.excluded``: outside capture windows, audits, compiling and in-process exports),
    which the report's whole-run statistics use; ``steps_excluded`` counts the others, and
    ``counted_data_wait_ms`` is the counted steps' data wait; ``max_step`` is the slowest counted
    step (the slowest step when none is counted); ``compile_ms`` is the time torch.compile spent
    compiling in these steps.
    """

    first_step: int
    last_step: int
    steps: int
    step_time_ms_mean: float
    step_time_ms_median: float
    step_time_ms_max: float
    data_wait_ms_mean: float
    max_step: int = -1
    steps_excluded: int = 0
    counted_us: tuple[int, ...] = ()
    counted_data_wait_ms: float = 0.0
    compile_ms: float = 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_ms_mean / self.step_time_ms_mean if self.step_time_ms_mean else 0.0

    def scalars(self) -> dict[str, float]:
        values = {
            "step_time_ms": self.step_time_ms_mean,
            "step_time_ms_median": self.step_time_ms_median,
            "step_time_ms_max": self.step_time_ms_max,
            "data_wait_ms": self.data_wait_ms_mean,
            "data_wait_share": self.data_wait_share,
        }
        if self.compile_ms:  # only where something compiled
            values["compile_ms"] = self.compile_ms
        return values


_HALF, _MILLION = 0.5, 1e6  # their bound methods round seconds to microseconds in C loops


class StepTimes:
    """Summarises steps every ``interval`` steps, or more when those last under ``min_s``
    seconds together (at most every :data:`MAX_SUMMARY_STEPS`).

    Holds only the pending interval's step times, data waits and capture flags (three flat
    lists, no object per step), so memory stays bounded whatever the interval.

    Example:
        >>> times = StepTimes(interval=2)
        >>> times.add(StepRecord(0, 0.010, 0.002))
        >>> times.add(StepRecord(1, 0.030, 0.002)).steps
        2
    """

    def __init__(self, *, interval: int = 50, min_s: float = 0.0) -> None:
        self._interval = min(interval, MAX_SUMMARY_STEPS)
        self._min_s = min_s
        self._first = 0  # number of the first pending step
        self._times: list[float] = []  # seconds
        self._pending_s = 0.0  # sum of the pending step times
        self._waits: list[float] = []  # seconds
        self._excluded: list[bool] = []
        self._compile_at: list[tuple[int, float]] = []  # (step, seconds compiling), rarely any

    def add(self, record: StepRecord) -> IntervalSummary | None:
        """Store ``record``; returns a summary when an interval is complete."""
        summaries = self.add_block(record.step, [record.step_time_s], [record.data_wait_s],
                                   record.excluded)
        return summaries[0] if summaries else None

    def add_block(self, first: int, times: list[float], waits: list[float],
                  excluded: bool, compile_s: float = 0.0) -> list[IntervalSummary]:
        """Store the consecutive steps ``first``, ``first + 1``, ... at once.

        Args:
            first: Number of the first step.
            times: Step times in seconds.
            waits: Data waits in seconds (as many as ``times``).
            excluded: Every one of these steps is excluded (``StepRecord.excluded``).
            compile_s: Seconds torch.compile spent in these steps.

        Returns:
            The summaries of the intervals completed, oldest first.
        """
        if not self._times:
            self._first = first
        self._times += times
        self._waits += waits
        self._excluded += [excluded] * len(times)
        self._pending_s += sum(times)
        if compile_s:
            self._compile_at.append((first, compile_s))
        summaries = []
        while len(self._times) >= self._interval:
            n = self._due_steps()
            if n == 0:
                break
            summaries.append(self._summarise(n))
        return summaries

    def _due_steps(self) -> int:
        """Steps of the next summary: ``interval``, or more until they last ``min_s`` (0: wait)."""
        if self._min_s <= 0:
            return self._interval
        if self._pending_s < self._min_s and len(self._times) < MAX_SUMMARY_STEPS:
            return 0  # cheap: most blocks of short steps end here
        sums = list(accumulate(self._times[:MAX_SUMMARY_STEPS]))  # rising: step times are >= 0
        reached = bisect_left(sums, self._min_s) + 1  # steps up to the first sum >= min_s
        if reached > len(sums):
            return MAX_SUMMARY_STEPS if len(self._times) >= MAX_SUMMARY_STEPS else 0
        return max(reached, self._interval)

    def flush(self) -> IntervalSummary | None:
        """Summarise whatever is pending (also a partial interval, e.g. at the end)."""
        return self._summarise(len(self._times)) if self._times else None

    def _summarise(self, n: int) -> IntervalSummary:
        """Summarise the first ``n`` pending steps and drop them."""
        times, waits, excluded = self._times[:n], self._waits[:n], self._excluded[:n]
        del self._times[:n], self._waits[:n], self._excluded[:n]
        self._pending_s = sum(self._times)
        first = self._first
        self._first = first + n
        compile_s = 0.0
        if self._compile_at:
            compile_s = sum(s for step, s in self._compile_at if step < first + n)
            self._compile_at = [(step, s) for step, s in self._compile_at if step >= first + n]
        if True in excluded:  # leave the excluded steps out of the counted ones
            keep = [k for k in range(n) if not excluded[k]]
            counted, counted_waits = [times[k] for k in keep], [waits[k] for k in keep]
        else:
            keep, counted, counted_waits = None, times, waits
        pool = counted or times
        slowest = pool.index(max(pool))  # the first slowest, as max() picks it
        if keep:
            slowest = keep[slowest]
        us = map(int, map(_HALF.__add__, map(_MILLION.__mul__, counted)))  # int(t * 1e6 + 0.5)
        return IntervalSummary(
            first_step=first,
            last_step=first + n - 1,
            steps=n,
            step_time_ms_mean=sum(times) / n * 1e3,
            step_time_ms_median=median(times) * 1e3,
            step_time_ms_max=max(times) * 1e3,
            data_wait_ms_mean=sum(waits) / n * 1e3,
            max_step=first + slowest,
            steps_excluded=n - len(counted),
            counted_us=tuple(us),
            counted_data_wait_ms=sum(counted_waits) * 1e3,
            compile_ms=round(compile_s * 1e3, 3),
        )
