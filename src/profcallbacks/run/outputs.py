"""Where one run's findings and step-time summaries go, and the marker that keeps its log
directory its own.

A finding passes the processors in order, each a callable that takes a finding and returns it,
changed or not (structlog's processors): the compile watcher's explanation of a slowdown, then
the late-report mark. The router then hands it to every handler: logging, the findings file,
TensorBoard, ``on_finding``, trackers. Summaries go to the metrics sinks, TensorBoard and the
steps file. When another run takes the log directory over (this one was suspended), this run's
files move to names of their own (:meth:`RunLock.leave_shared`).

Example:
    >>> from profcallbacks.options.profiler import ProfilerConfig
    >>> out = RunOutputs(ProfilerConfig(schedule=None, tensorboard_scalars=False),
    ...                  getfixture("tmp_path"), RankInfo(), handlers=[])
    >>> out.emit(Finding("sync_point", 7, 0, "warning", "item() at train.py:3")); out.findings[0].step
    7
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import IntervalSummary
from profcallbacks.findings import Finding, FindingHandler, FindingRouter, FindingsFile, reported_late
from profcallbacks.layout import findings_file, new_run_id, steps_file
from profcallbacks.run.runlock import RunLock, claim_logdir
from profcallbacks.run.sinks import MetricsSink, StepsFile, SummaryPublisher, TensorBoardWriter

if TYPE_CHECKING:
    from profcallbacks.options.profiler import ProfilerConfig

log = logging.getLogger(__name__)

FindingProcessor = Callable[[Finding], Finding]
"""One step of a finding's way to the handlers: takes the finding, returns it (changed or not)."""


class LateMark:
    """The processor that marks a finding coming after findings of later steps (a verdict the
    export helper made for an earlier capture) with ``details["reported_at_step"]``: logs and
    findings files are streams, so it says where the run was when it came.

    Args:
        step_now: The step in progress.

    Example:
        >>> mark = LateMark(lambda: 60)
        >>> mark(Finding("step_slowdown", 50, 0, "warning", "slow")).details
        {}
        >>> mark(Finding("capture_verdict", 24, 0, "info", "input_bound")).details
        {'reported_at_step': 59}
    """

    def __init__(self, step_now: Callable[[], int]) -> None:
        self._step_now = step_now
        self._latest = -1  # the latest step of a finding emitted so far

    def __call__(self, finding: Finding) -> Finding:
        if finding.step < self._latest:
            return reported_late(finding, max(self._latest, self._step_now() - 1))
        self._latest = finding.step
        return finding


class RunOutputs:
    """The sinks of one run, opened by :meth:`open` and closed by :meth:`close`.

    Args:
        config: The run's options (``tensorboard_scalars``).
        logdir: The run's log directory (prepared).
        rank: This process's place among the ranks.
        handlers: Finding handlers from the start (logging, ``on_finding``).
        metrics_sinks: Receive each summary's values.
        processors: Applied to each finding in order before the handlers.
    """

    def __init__(self, config: ProfilerConfig, logdir: Path, rank: RankInfo, *,
                 handlers: list[FindingHandler], metrics_sinks: Iterable[MetricsSink] = (),
                 processors: Iterable[FindingProcessor] = ()) -> None:
        self.config = config
        self.logdir = logdir
        self.rank = rank
        self.router = FindingRouter(handlers)
        self.processors = list(processors)
        self.run_id: str | None = None
        self._metrics_sinks = list(metrics_sinks)
        self._tensorboard: TensorBoardWriter | None = None
        self._publisher: SummaryPublisher | None = None
        self._findings_file: FindingsFile | None = None
        self._lock: RunLock | None = None

    @property
    def findings(self) -> list[Finding]:
        """Every finding emitted so far."""
        return self.router.findings

    def open(self) -> None:
        """Take the run marker (rank 0), open the findings and steps files and TensorBoard.

        Raises:
            LogdirInUseError: Another live run writes into the log directory.
        """
        rank = self.rank.rank
        self._lock = claim_logdir(self.logdir) if rank == 0 else None
        self.run_id = new_run_id()
        self._findings_file = FindingsFile(findings_file(self.logdir, rank), self.run_id)
        self.router.add_handler(self._findings_file)
        if self.config.tensorboard_scalars:
            self._tensorboard = TensorBoardWriter(self.logdir)
            self._tensorboard.start()  # import and create now, not inside a timed step
            self.router.add_handler(self._tensorboard.finding)
        prefix = f"profcallbacks/rank{rank}" if self.rank.is_distributed else "profcallbacks"
        self._publisher = SummaryPublisher(prefix, rank=rank, sinks=self._metrics_sinks,
                                           tensorboard=self._tensorboard,
                                           steps_file=StepsFile(steps_file(self.logdir, rank),
                                                                run_id=self.run_id))

    @property
    def publishing(self) -> bool:
        """Summaries have somewhere to go (between :meth:`open` and :meth:`close`)."""
        return self._publisher is not None

    def emit(self, finding: Finding) -> None:
        """Pass ``finding`` through the processors, then to every handler."""
        self._follow_lock()
        for process in self.processors:
            finding = process(finding)
        self.router.emit(finding)

    def publish(self, summary: IntervalSummary, extra: dict[str, float],
                fields: dict[str, float]) -> None:
        """Hand ``summary`` with its ``extra`` scalars and ``fields`` (memory) to the sinks."""
        self._follow_lock()
        if self._publisher is not None:
            self._publisher.publish(summary, extra, fields)

    def _follow_lock(self) -> None:
        lock = self._lock
        if lock is not None and lock.lost:
            steps = self._publisher.steps_file if self._publisher is not None else None
            lock.leave_shared((steps, self._findings_file))

    def write_pending(self) -> None:
        """Write the step summaries held back (the steps file writes once a second); never raises."""
        if self._publisher is not None:
            self._publisher.write_pending()

    def release_lock(self) -> None:
        """Give the run marker back; never raises."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def close(self) -> None:
        """Write what is left and give the marker back."""
        try:
            if self._publisher is not None:
                self._publisher.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            if self._findings_file is not None:
                self._findings_file.close()
        finally:
            self.release_lock()
