"""Always-on step timing in bounded memory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

MAX_SUMMARY_STEPS = 1000
"""A summary covers at most this many steps, whatever ``log_every_n_steps`` is (bounded memory)."""


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
        captured: The step ran with a profiler attached (warmup or active), under the sync
            audit, or while a capture was exported on a thread of this process (the fallback when no
            helper process could start): its time is not the job's own.
        after_pause: The step followed a pause (validation, checkpoint) or the start of training.

    A ``NamedTuple`` rather than a dataclass: one is made per step, and this is the cheapest.
    """

    step: int
    step_time_s: float
    data_wait_s: float
    captured: bool = False
    after_pause: bool = False


@dataclass(frozen=True)
class IntervalSummary:
    """Aggregate of the steps since the last summary (what scalars and the steps file hold).

    The ``step_time_ms_*`` and ``data_wait_ms_mean`` fields cover every step of the interval;
    ``healthy_us`` lists the step times (whole microseconds) of the steps outside capture windows, audits and
    exports, which the report's whole-run statistics use; ``steps_excluded`` counts the others;
    ``max_step`` is the slowest healthy step (the slowest step when none is healthy).
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
    healthy_us: tuple[int, ...] = ()
    healthy_data_wait_ms: float = 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_ms_mean / self.step_time_ms_mean if self.step_time_ms_mean else 0.0

    def scalars(self) -> dict[str, float]:
        return {
            "step_time_ms": self.step_time_ms_mean,
            "step_time_ms_median": self.step_time_ms_median,
            "step_time_ms_max": self.step_time_ms_max,
            "data_wait_ms": self.data_wait_ms_mean,
            "data_wait_share": self.data_wait_share,
        }


class StepTimes:
    """Summarises steps every ``interval`` steps (at most every :data:`MAX_SUMMARY_STEPS`).

    Holds only the pending interval's records, so memory stays bounded whatever the interval.

    Example:
        >>> times = StepTimes(interval=2)
        >>> times.add(StepRecord(0, 0.010, 0.002))
        >>> times.add(StepRecord(1, 0.030, 0.002)).steps
        2
    """

    def __init__(self, *, interval: int = 50) -> None:
        self._interval = min(interval, MAX_SUMMARY_STEPS)
        self._pending: list[StepRecord] = []

    def add(self, record: StepRecord) -> IntervalSummary | None:
        """Store ``record``; returns a summary when an interval is complete."""
        self._pending.append(record)
        if len(self._pending) < self._interval:
            return None
        return self.flush()

    def add_block(self, records: list[StepRecord]) -> list[IntervalSummary]:
        """Store a block of records at once; returns the summaries of intervals completed."""
        pending = self._pending
        pending += records
        summaries = []
        while len(pending) >= self._interval:
            self._pending, rest = pending[:self._interval], pending[self._interval:]
            summary = self.flush()
            if summary is not None:
                summaries.append(summary)
            pending = self._pending = rest
        return summaries

    def flush(self) -> IntervalSummary | None:
        """Summarise whatever is pending (also a partial interval, e.g. at the end)."""
        if not self._pending:
            return None
        records, self._pending = self._pending, []
        times = [r.step_time_s for r in records]
        n = len(times)
        healthy = [r for r in records if not r.captured]
        slowest = max(healthy or records, key=lambda r: r.step_time_s)
        return IntervalSummary(
            first_step=records[0].step,
            last_step=records[-1].step,
            steps=n,
            step_time_ms_mean=sum(times) / n * 1e3,
            step_time_ms_median=median(times) * 1e3,
            step_time_ms_max=max(times) * 1e3,
            data_wait_ms_mean=sum(r.data_wait_s for r in records) / n * 1e3,
            max_step=slowest.step,
            steps_excluded=n - len(healthy),
            healthy_us=tuple(int(r.step_time_s * 1e6 + 0.5) for r in healthy),
            healthy_data_wait_ms=sum(r.data_wait_s for r in healthy) * 1e3,
        )
