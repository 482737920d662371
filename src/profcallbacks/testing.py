"""Test doubles for code that uses profcallbacks: a fake clock, recorders, and a scripted run.

They are what this project's own tests use, shipped so that your tests can drive a
:class:`~profcallbacks.ProfilingSession` or a detector without sleeping or training.

Example:
    >>> from profcallbacks import ProfilerConfig
    >>> run = ScriptedRun(ProfilerConfig(schedule=None, tensorboard_scalars=False,
    ...                                  watch_capture_file=False, sync_audit=False),
    ...                   logdir=getfixture("tmp_path"))
    >>> run.steps([(0.010, 0.002)] * 3)          # three 10 ms steps with 2 ms of data wait each
    >>> [round(r.step_time_s, 3) for r in run.close()]
    [0.01, 0.01, 0.01]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.base import Detector
from profcallbacks.findings import Finding
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.defaults import default_detectors
from profcallbacks.run.session import ProfilingSession


class FakeClock:
    """A clock that moves only when told to: pass it as ``clock=`` and advance ``now`` (seconds).

    Example:
        >>> clock = FakeClock(start=100.0)
        >>> clock.advance(0.5); clock()
        100.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class StepRecorder:
    """A detector that keeps every :class:`StepRecord` it is shown and finds nothing.

    Example:
        >>> recorder = StepRecorder()
        >>> list(recorder.observe(StepRecord(0, 0.01, 0.0))), len(recorder.records)
        ([], 1)
    """

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def observe(self, record: StepRecord) -> Iterable[Finding]:
        self.records.append(record)
        return ()


class RecordingSink:
    """A metrics sink (``metrics_sinks=[sink]``) that keeps each ``(values, step)`` it receives.

    Example:
        >>> sink = RecordingSink()
        >>> sink({"profcallbacks/step_time_ms": 2.0}, 9); sink.calls
        [({'profcallbacks/step_time_ms': 2.0}, 9)]
    """

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int]] = []

    def __call__(self, values: dict[str, float], step: int) -> None:
        self.calls.append((dict(values), step))


class ScriptedRun:
    """A :class:`ProfilingSession` on a :class:`FakeClock`, driven by a script of step times.

    The session runs the detectors of ``config`` (``default_detectors``) plus any given, and a
    :class:`StepRecorder`, so both the findings and the exact step records can be checked.

    Args:
        config: The profiler options.
        logdir: Where the session writes its files.
        detectors: Detectors to run instead of those of ``config``.
        rank: The process's identity (default: rank 0 of 1 on ``test-host``).
    """

    def __init__(self, config: ProfilerConfig, logdir: Path, *,
                 detectors: Iterable[Detector] | None = None, rank: RankInfo | None = None) -> None:
        self.clock = FakeClock()
        self.recorder = StepRecorder()
        self.rank = rank or RankInfo(host="test-host")
        chosen = list(detectors) if detectors is not None else default_detectors(config, self.rank)
        self.session = ProfilingSession(config, Path(logdir), rank=self.rank, clock=self.clock,
                                        detectors=[*chosen, self.recorder])
        self.session.open()

    @property
    def findings(self) -> list[Finding]:
        return self.session.findings

    def step(self, step_s: float, data_wait_s: float = 0.0) -> None:
        """One step of ``step_s`` seconds, the first ``data_wait_s`` of them waiting for data."""
        self.clock.advance(data_wait_s)
        self.session.data_wait(data_wait_s)
        self.clock.advance(step_s - data_wait_s)
        self.session.step_end()

    def steps(self, script: Iterable[tuple[float, float]]) -> None:
        """One :meth:`step` per ``(step_s, data_wait_s)`` pair."""
        for step_s, data_wait_s in script:
            self.step(step_s, data_wait_s)

    def pause(self, seconds: float) -> None:
        """Work between steps (e.g. evaluation) lasting ``seconds``."""
        self.session.pause()
        self.clock.advance(seconds)
        self.session.resume()

    def close(self) -> list[StepRecord]:
        """Close the session; returns every step record it produced."""
        self.session.close()
        return self.recorder.records
