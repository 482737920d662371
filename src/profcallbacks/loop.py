"""The plain-PyTorch-loop front end."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sized
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from torch.profiler import record_function
from torch.utils.data import DataLoader

from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.triggers import MANUAL
from profcallbacks.findings import Finding, FindingHandler
from profcallbacks.integrations.base import RunLog, check_metrics_sink, close_quietly, extra_sinks
from profcallbacks.options.front_end import ProfilerOptions, Unpack, takes_profiler_options
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.session import ProfilingSession
from profcallbacks.run.sinks import MetricsSink

T = TypeVar("T")


class Batches(Iterator[T]):
    """The items of a wrapped iterable, each fetch timed (what :meth:`StepProfiler.wrap` returns).

    Example:
        >>> batches = Batches(iter([1, 2]))
        >>> next(batches), list(batches)
        (1, [2])
    """

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items

    def __iter__(self) -> Batches[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)


class SizedBatches(Batches[T]):
    """:class:`Batches` of an iterable with a length: ``len()`` is the iterable's.

    Example:
        >>> batches = SizedBatches(iter([1, 2]), [1, 2])
        >>> len(batches), list(batches)
        (2, [1, 2])
    """

    def __init__(self, items: Iterator[T], source: Sized) -> None:
        super().__init__(items)
        self._source = source

    def __len__(self) -> int:
        return len(self._source)


class StepProfiler:
    """Profiles a plain training loop: step timing always, torch.profiler only in windows.

    Args:
        logdir: Directory for traces, scalars and findings (created if missing).
        **options: Every option of :class:`~profcallbacks.options.profiler.ProfilerConfig`
            (``schedule``, ``trace``, ``max_captures``, ``stall``, ``slowdown``, ``sync_audit``,
            ``memory``, ``budget``, ...), by keyword, documented and validated there
            (declared once in :mod:`profcallbacks.options.front_end`).
        on_finding: Called with each :class:`Finding` as it is made.
        metrics_sink: Called with each summary's scalars and its last step,
            ``sink({"profcallbacks/step_time_ms": 4.2, ...}, 199)`` (a ``MetricsSink``). A
            :class:`~profcallbacks.integrations.base.RunLog` such as
            :class:`~profcallbacks.integrations.wandb_run.WandbSink` or
            :class:`~profcallbacks.integrations.mlflow_run.MlflowSink` gets the findings too and
            is closed when the profiler closes.

    Example:
        >>> from profcallbacks import Schedule
        >>> prof = StepProfiler("runs/exp1", schedule=Schedule(skip_first=10, active=5))
        >>> with prof:                                   # doctest: +SKIP
        ...     for batch in prof.wrap(loader):
        ...         train_step(batch); prof.step()
    """

    @takes_profiler_options
    def __init__(self, logdir: str | os.PathLike[str], *, on_finding: FindingHandler | None = None,
                 metrics_sink: MetricsSink | None = None,
                 **options: Unpack[ProfilerOptions]) -> None:
        config = ProfilerConfig.from_arguments(type(self).__name__, dict(options), logdir=logdir,
                                               on_finding=on_finding, logdir_required=True)
        self._metrics_sink = check_metrics_sink("StepProfiler", metrics_sink)
        rank = RankInfo.detect()
        self.session = ProfilingSession(config, Path(logdir), rank=rank, on_finding=on_finding,
                                        metrics_sinks=extra_sinks(metrics_sink))
        if isinstance(metrics_sink, RunLog):
            self.session.add_finding_handler(metrics_sink.finding)
        if (not config.tracker_captures and metrics_sink is not None
                and hasattr(metrics_sink, "log_captures")):  # a WandbSink or MlflowSink
            metrics_sink.log_captures = False  # verdicts, no trace files
        if type(self).step is StepProfiler.step:  # (a subclass's own step is left alone)
            self.step = self.session.step_end  # type: ignore[method-assign]  # see step()

    @classmethod
    def from_config(cls, config: ProfilerConfig, logdir: str | os.PathLike[str], *,
                    on_finding: FindingHandler | None = None,
                    metrics_sink: MetricsSink | None = None) -> StepProfiler:
        """A profiler with the options of ``config`` (one config shared by several front ends).

        Example:
            >>> config = ProfilerConfig(schedule=None, max_captures=2)
            >>> StepProfiler.from_config(config, getfixture("tmp_path")).session.config == config
            True
        """
        return cls(logdir, **config.options(), on_finding=on_finding, metrics_sink=metrics_sink)

    def __enter__(self) -> StepProfiler:
        self.session.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            self.session.on_exception(exc)  # out_of_memory is written before the error propagates
        self.session.close(failed=exc_type is not None)
        if isinstance(self._metrics_sink, RunLog):
            close_quietly(self._metrics_sink)

    def wrap(self, iterable: Iterable[T]) -> Batches[T]:
        """Yields from ``iterable``, timing how long each item took to arrive.

        The wrap iterates once, as a generator does, and has ``len(iterable)`` when ``iterable``
        has a length: code that asks the loader's length (torchvision's
        ``MetricLogger.log_every(prof.wrap(loader), ...)``) takes the wrap where the loader was.
        Inside a recording capture window each fetch is also marked in the trace as
        ``enumerate(DataLoader)#<type>.__next__``, so the traced breakdown and the step timing
        agree on data wait for any iterable (e.g. ``iter(get_batch, None)``), not only DataLoaders.
        """
        items = self._timed(iterable)
        return SizedBatches(items, iterable) if isinstance(iterable, Sized) else Batches(items)

    def _timed(self, iterable: Iterable[T]) -> Iterator[T]:
        self.session.set_loader(iterable)
        clock, session = time.perf_counter, self.session
        # marked like DataLoader's own fetches, so traces count them as data wait too
        mark = f"enumerate(DataLoader)#{type(iterable).__name__}.__next__"
        marks = not isinstance(iterable, DataLoader)  # a DataLoader marks its own
        workers = session.loader_workers  # times a DataLoader's workers while asked to
        start = clock()
        iterator = workers.iterate(iterable)
        while True:
            try:
                if marks and session.tracing:  # only inside a recording window: free outside it
                    with record_function(mark):
                        item = next(iterator)
                else:
                    item = next(iterator)
            except StopIteration:
                return
            end = clock()
            session.data_wait(end - start)
            workers.fetched(start, end)
            if session.auditing:  # the audit follows what is computed from the batch
                session.mark_batch(item)
            yield item
            start = clock()

    def step(self) -> None:
        """Call once per optimizer step, after it.

        A profiler's ``step`` is its session's ``step_end`` itself, bound at construction: the
        same code without this method's call (~0.4 us per step in situ,
        ``benchmarks/overhead.py``), on every device (the CUDA step event is recorded by the
        session's step clock).
        """
        self.session.step_end()

    def capture(self, steps: int | None = None) -> None:
        """Capture ``steps`` steps (default ``capture_steps``) starting at the next step."""
        self.session.request_capture(steps, trigger=MANUAL)

    def pause(self, activity: str | None = None) -> None:
        """Work between steps begins (evaluation, checkpointing): it is timed as no step.

        Pass ``activity="validation"`` around evaluation to capture it in a window of its own
        when ``capture_validation=True``.
        """
        self.session.pause(activity)

    def resume(self) -> None:
        """The work between steps is over."""
        self.session.resume()

    @property
    def findings(self) -> list[Finding]:
        return self.session.findings

    def _repr_html_(self) -> str:
        """In a notebook: the verdicts, step-time plot and findings of ``logdir`` so far."""
        from profcallbacks.report.notebook import logdir_html

        return logdir_html(self.session.logdir)

    @property
    def captures(self) -> list[Path]:
        """Capture directories written so far."""
        return self.session.captures
