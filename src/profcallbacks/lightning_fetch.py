"""Times the Lightning training loop's batch fetches through the Trainer's public profiler hook,
and the workers of its first pass over the training loader."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch.profilers import Profiler

from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.defaults import workers_timing
from profcallbacks.run.session import ProfilingSession

FETCH_ACTION = "train_dataloader_next"


class FetchTimer(Profiler):
    """Wraps ``trainer.profiler`` and reports how long each training batch fetch blocked.

    Lightning announces each fetch as ``profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``,
    so this sees the real wait for data, and not the loop's own work between batches (progress
    bar, logging, other callbacks), which a gap between batch hooks would count as data wait.
    Every call is passed on to the wrapped profiler, so a ``SimpleProfiler`` keeps working.
    ``profile()``, which Lightning calls around every hook, is the wrapped profiler's own bound
    method: the hooks pay nothing for this wrapper (only ``start``/``stop`` of batch fetches and
    manual optimizer steps come through it).

    Example:
        >>> trainer.profiler = FetchTimer(trainer.profiler, session.data_wait)  # doctest: +SKIP
    """

    def __init__(self, inner: Profiler, on_fetch: Callable[[float], None]) -> None:
        super().__init__()
        self.inner = inner
        self._on_fetch = on_fetch
        self._clock = time.perf_counter
        self._started = 0.0
        self.profile = inner.profile  # type: ignore[method-assign]  # no frame of ours per hook

    def start(self, action_name: str) -> None:
        if action_name.endswith(FETCH_ACTION):
            self._started = self._clock()
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        self.inner.stop(action_name)
        if action_name.endswith(FETCH_ACTION):
            self._on_fetch(self._clock() - self._started)

    def summary(self) -> str:
        return self.inner.summary()

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank, log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)

    def __getattr__(self, name: str) -> Any:  # e.g. dirpath, filename of the wrapped profiler
        return getattr(self.__dict__["inner"], name)


class FirstPassTiming:
    """Times the workers of the Trainer's first pass over its training loader, which Lightning
    begins in its data set-up, before ``on_train_start`` makes the session: from ``setup`` on,
    an early worker timing attaches the training loaders
    (:class:`~profcallbacks.detect.worker_attach.FirstPass`); :meth:`hand_over` gives the
    pass to the session's.

    Example:
        >>> timing = FirstPassTiming(config, trainer); timing.start()  # doctest: +SKIP
        >>> timing.hand_over(session)  # in on_train_start                # doctest: +SKIP
    """

    def __init__(self, config: ProfilerConfig, trainer: Any) -> None:
        self._early = workers_timing(config, lambda: 0)
        self._hook = self._early.first_pass(lambda loader: _trains_on(trainer, loader))

    def start(self) -> None:
        if not self._early.off:
            self._hook.start()

    def hand_over(self, session: ProfilingSession) -> None:
        """Stop the early hook; the session's worker timing goes on with what it timed."""
        self._hook.stop()
        session.loader_workers.take_over(self._early)

    def stop(self) -> None:
        self._hook.stop()
        self._early.detach()


def _trains_on(trainer: Any, loader: Any) -> bool:
    """``loader`` is (one of) the Trainer's training loaders."""
    loaders = trainer.train_dataloader
    found = (loaders.values() if isinstance(loaders, dict)
             else loaders if isinstance(loaders, (list, tuple)) else [loaders])
    return any(item is loader for item in found)
