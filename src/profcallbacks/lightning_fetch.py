"""Times the Lightning training loop's batch fetches through the Trainer's public profiler hook."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch.profilers import Profiler

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
