"""Worker timing of a ``DataLoader``, in the main process: the passes' shared memory, read back.

:meth:`LoaderWorkers.iterate` starts a pass over a loader with workers so that each worker times
its batches (:mod:`~profcallbacks.detect.worker_hooks`) into the pass's
:class:`~profcallbacks.detect.worker_ring.WorkerRing`; :meth:`LoaderWorkers.fetched` notes how
long the training loop waited for each batch. Timing runs only while something asks for it
(:meth:`want`: the loop waiting for batches ``share_on`` of its time or more, an open stall, a
recording capture window), the stack sampler only while a stall opens or is open (not for a
capture window alone); the workers' start-up is always noted (once per worker). Loaders a Trainer
iterates itself are timed through :meth:`attach` (:mod:`~profcallbacks.detect.worker_attach`).
:meth:`breakdown` sums the recent batches up per worker
(:class:`~profcallbacks.detect.worker_breakdown.WorkersBreakdown`), :meth:`spans` gives their
fetch/collate/send spans for a capture's trace.

Any failure in setting timing up turns it off for the run with one warning; the loader is then
iterated exactly as without it.

Example:
    >>> from torch.utils.data import DataLoader
    >>> workers = LoaderWorkers(lambda: 0)
    >>> list(workers.iterate(DataLoader(range(4), batch_size=2)))  # no workers: nothing to time
    [tensor([0, 1]), tensor([2, 3])]
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from profcallbacks.detect.worker_attach import FirstPass, LoaderHooks
from profcallbacks.detect.worker_breakdown import BatchTimes, WaitTimes, WorkersBreakdown, summarise
from profcallbacks.detect.worker_hooks import TimedCollate, WorkerInit
from profcallbacks.detect.worker_pin import time_pinning
from profcallbacks.detect.worker_ring import (
    FAILED,
    IDX,
    PASS,
    READY,
    RING,
    SAMPLING,
    STARTED,
    STATUS,
    T_COLLATE0,
    T_COLLATE1,
    T_GET,
    T_PUT,
    T_SEND0,
    T_SEND1,
    TIMING,
    WorkerRing,
)

log = logging.getLogger(__name__)

PERIOD_S = 0.2
"""Seconds over which the loop's share of time waiting for batches is taken."""
KEPT = 4096
"""Batches (worker rows and main-process waits) kept for the breakdown and the trace."""


class _Pass:
    """One set of worker processes: its ring, and the passes over the loader it has served."""

    def __init__(self, number: int, ring: WorkerRing, started: float) -> None:
        self.number, self.ring, self.started = number, ring, started
        self.served = 0  # passes begun over these workers (persistent workers serve several)
        self.seen = [0] * ring.workers
        self.warned = False


class LoaderWorkers:
    """Times the batches of a loader's workers while asked to (see the module docstring).

    Args:
        step: The step in progress (the session's), noted with each wait.
        enabled: Time the workers at all (``False``: :meth:`iterate` is ``iter``).
        sampler: Sample the workers' stacks while sampling is wanted.
        share_on: Time the workers while the loop waits this share (0-1) of its time or more
            over :data:`PERIOD_S` (the stall detector's ``share_threshold``).
    """

    def __init__(self, step: Callable[[], int], *, enabled: bool = True,
                 sampler: bool = True, share_on: float = 0.2) -> None:
        self._step = step
        self._sampler = sampler
        self._broken = not enabled
        self._persistent: weakref.WeakKeyDictionary[Any, _Pass] = weakref.WeakKeyDictionary()
        self._pass: _Pass | None = None
        self._passes = 0
        self._batch = 0  # batches fetched in the current pass
        self._wanted: dict[str, bool] = {}  # reason -> sampling too
        self.batches: deque[BatchTimes] = deque(maxlen=KEPT)
        self._share_on = share_on
        self._waited, self._period_from, self._pass_workers = 0.0, 0.0, 0
        self.waits: dict[tuple[int, int, int], tuple[float, float, int]] = {}
        self._wait_keys: deque[tuple[int, int, int]] = deque()
        self.pins: dict[tuple[int, int, int], tuple[float, float]] = {}  # the pin thread's
        self._pin_keys: deque[tuple[int, int, int]] = deque()
        self._last_drain = 0
        self._hooks = LoaderHooks(self)

    @property
    def off(self) -> bool:
        """Worker timing is off for the run (turned off, or it failed to set up)."""
        return self._broken

    def attach(self, loader: object) -> None:
        """Time the passes a framework begins over ``loader`` itself (a Trainer's ``iter``);
        :meth:`detach` removes the hooks (:class:`~profcallbacks.detect.worker_attach.LoaderHooks`)."""
        self._hooks.attach(loader)

    def detach(self) -> None:
        """Remove the hooks :meth:`attach` set."""
        self._hooks.detach()

    def take_over(self, early: LoaderWorkers) -> None:
        """Go on with the passes ``early`` began before this object existed (a Trainer makes its
        first iterator before its session starts: :class:`~profcallbacks.detect.worker_attach.FirstPass`)."""
        self._persistent, self._pass, self._passes = early._persistent, early._pass, early._passes
        self._batch, self._pass_workers = early._batch, early._pass_workers
        self._hooks.adopt(early._hooks)
        self._control()

    def first_pass(self, chosen: Callable[[Any], bool]) -> FirstPass:
        """The hook that times a Trainer's first pass (``chosen``: a training loader)."""
        return FirstPass(self._hooks, chosen)

    def resumed(self, loader: object) -> None:
        """A further pass over ``loader``'s persistent workers begins."""
        current = self._persistent.get(loader)
        if current is not None:
            self.again(current)

    @property
    def timing(self) -> bool:
        """Worker timing is on now."""
        return bool(self._wanted) and self._pass is not None

    def iterate(self, loader: Iterable[Any]) -> Iterator[Any]:
        """``iter(loader)``, its workers timed when it is a DataLoader with workers."""
        from torch.utils.data import DataLoader

        if self._broken or not isinstance(loader, DataLoader) or not loader.num_workers:
            self._pass = None
            return iter(loader)
        return self.begin(loader, lambda: iter(loader))

    def begin(self, loader: Any, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """A pass over ``loader`` (a DataLoader with workers) begins: ``make()`` makes its
        iterator, with the timing hooks set on the loader while it runs (new workers only)."""
        try:
            current = self._persistent.get(loader) if loader.persistent_workers else None
            fresh = current is None
            if current is None:
                self._passes += 1
                current = _Pass(self._passes, WorkerRing(int(loader.num_workers)), time.perf_counter())
            user_init, user_collate = loader.worker_init_fn, loader.collate_fn
            if fresh:
                loader.worker_init_fn = WorkerInit(user_init, current.ring, sampler=self._sampler)
                loader.collate_fn = TimedCollate(user_collate)
                self._control(current)  # before the first indices reach the new workers
        except Exception as exc:
            return self._give_up(exc, make)
        try:
            iterator = make()
        finally:
            if fresh:
                loader.worker_init_fn, loader.collate_fn = user_init, user_collate
        if fresh:
            try:
                time_pinning(iterator, self._pinned)
            except Exception as exc:  # the loader goes on, its pinning counted as transfer
                log.warning("profcallbacks: cannot time the DataLoader's pin-memory thread (%s).", exc)
        if fresh and loader.persistent_workers:
            self._persistent[loader] = current
        self.again(current)
        return iterator

    def again(self, current: _Pass | None = None) -> None:
        """A further pass begins over the workers of ``current`` (default: the current set's;
        persistent workers serve several passes)."""
        current = current if current is not None else self._pass
        if current is None:
            return
        current.served += 1
        self._pass, self._batch = current, 0
        self._pass_workers, self._waited, self._period_from = current.ring.workers, 0.0, 0.0
        self._control()

    def _give_up(self, exc: Exception, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        self._broken, self._pass = True, None
        log.warning("profcallbacks: cannot time the DataLoader's workers (%s); worker timing is "
                    "off for this run.", exc)
        return make()

    def fetched(self, start: float, end: float) -> None:
        """The training loop waited from ``start`` to ``end`` (``perf_counter`` seconds) for the
        current pass's next batch."""
        current = self._pass
        if current is None:
            return
        self._batch += 1
        self._waited += end - start
        if end - self._period_from >= PERIOD_S:
            self._period(end)
        if not self._wanted:
            return
        key = (current.number, current.served - 1, self._batch - 1)
        self.waits[key] = (start, end, self._step())
        self._wait_keys.append(key)
        if len(self._wait_keys) > KEPT:
            self.waits.pop(self._wait_keys.popleft(), None)
        if self._batch - self._last_drain >= RING // 4:
            self.drain()

    def _period(self, now: float) -> None:
        """A period of waits is over: time the workers while the loop waits ``share_on`` of
        its time or more (the first batches of a pass wait for the workers' start: left out)."""
        if self._batch <= self._pass_workers:
            self._waited = 0.0
            self._period_from = now
            return
        share = self._waited / (now - self._period_from)
        self._waited, self._period_from = 0.0, now
        if share >= self._share_on:
            if "waits" not in self._wanted:  # a stall opens: its finding comes soon after
                self.want("waits", True)
        elif "waits" in self._wanted:
            self.want("waits", False)

    def want(self, reason: str, on: bool, *, sampling: bool = True) -> None:
        """Ask for worker timing (and stack sampling) for ``reason``, or stop asking."""
        if on:
            self._wanted[reason] = sampling
        else:
            self._wanted.pop(reason, None)
        self._control()

    def _control(self, current: _Pass | None = None) -> None:
        current = current if current is not None else self._pass
        if current is None:
            return
        control = current.ring.control
        control[TIMING] = 1.0 if self._wanted else 0.0
        control[SAMPLING] = 1.0 if self._sampler and any(self._wanted.values()) else 0.0

    def _pinned(self, idx: int, start: float, end: float) -> None:
        """The pin thread pinned the current pass's batch ``idx`` from ``start`` to ``end``
        (called on that thread: only it writes ``pins``)."""
        current = self._pass
        if current is None or not self._wanted:
            return
        key = (current.number, current.served - 1, idx)
        self.pins[key] = (start, end)
        self._pin_keys.append(key)
        if len(self._pin_keys) > KEPT:
            self.pins.pop(self._pin_keys.popleft(), None)

    def drain(self) -> None:
        """Read the rows the current pass's workers committed since the last time."""
        current = self._pass
        if current is None:
            return
        self._last_drain = self._batch
        ring = current.ring
        for worker in range(ring.workers):
            if ring.heads[worker, STATUS] == FAILED and not current.warned:
                current.warned = True
                log.warning("profcallbacks: DataLoader worker %d could not be timed (this "
                            "torch's worker loop differs); its batches are left out.", worker)
            current.seen[worker], rows = ring.read_new(worker, current.seen[worker])
            for row in rows:
                self.batches.append(BatchTimes(
                    current.number, int(row[PASS]), int(row[IDX]), worker, float(row[T_GET]),
                    float(row[T_COLLATE0]), float(row[T_COLLATE1]), float(row[T_PUT]),
                    float(row[T_SEND0]), float(row[T_SEND1])))

    def startup_s(self) -> list[tuple[float, float]] | None:
        """Per worker of the current set: ``(seconds from the pass's start to the worker's
        ``worker_init_fn``, seconds in it)``; ``None`` before every worker has started."""
        current = self._pass
        if current is None:
            return None
        heads = current.ring.heads
        if any(heads[w, READY] == 0 for w in range(current.ring.workers)):
            return None
        return [(float(heads[w, STARTED]) - current.started,
                 float(heads[w, READY] - heads[w, STARTED])) for w in range(current.ring.workers)]

    def hot_lines(self) -> list[dict[str, Any]]:
        """The sampler's counts of each worker of the current set (empty: none published)."""
        current = self._pass
        if current is None:
            return []
        out = [current.ring.hot_lines(w) for w in range(current.ring.workers)]
        return [value for value in out if value]

    def breakdown(self, *, num_workers: int | None = None) -> WorkersBreakdown | None:
        """The recent batches summed up per worker (``None``: no timed batch yet)."""
        self.drain()
        current = self._pass
        workers = num_workers or (current.ring.workers if current is not None else 0)
        return summarise(list(self.batches), self.waits, workers=workers, pins=dict(self.pins),
                         hot=self.hot_lines(), startup=self.startup_s())

    def spans(self, start: float, end: float) -> list[BatchTimes | WaitTimes]:
        """The timed batches, and the loop's waits for them, that overlap ``start``-``end``
        (``perf_counter`` seconds)."""
        self.drain()
        out: list[BatchTimes | WaitTimes] = [
            b for b in self.batches if b.get < end and max(b.send1, b.put) > start]
        out += [WaitTimes(*key, a, z) for key, (a, z, _) in self.waits.items()
                if a < end and z > start]
        return out
