"""What runs inside a DataLoader worker: the hooks that time each batch's fetch, collate and send.

:class:`WorkerInit` is the loader's ``worker_init_fn`` for one pass (it calls the user's first)
and :class:`TimedCollate` its ``collate_fn``; both are set on the loader only while the pass's
iterator is made, so the loader keeps the user's own. In the worker, ``WorkerInit`` finds torch's
worker loop among its callers and wraps, on that worker's own objects only:

- ``index_queue.get``: the batch's index arrives (its fetch starts) -> ``T_GET``;
- the collate function -> ``T_COLLATE0``/``T_COLLATE1`` (the fetch ends where collate starts);
- ``data_queue.put`` -> ``T_PUT``, and in the queue's feeder thread the pickling
  (``ForkingPickler.dumps``: tensors moved to shared memory) and the write to the pipe ->
  ``T_SEND0``/``T_SEND1``, after which the row is committed.

Nothing here changes a batch. Any failure leaves the worker untimed (``STATUS = FAILED``), and the
main process warns once. The batch's own items are never copied or pickled again.

Example:
    >>> collate = TimedCollate(list)
    >>> collate([1, 2])  # outside a timed worker: the user's collate_fn, untouched
    [1, 2]
"""

from __future__ import annotations

import multiprocessing.queues
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from profcallbacks.detect.worker_ring import (
    FAILED,
    FIELDS,
    IDX,
    OK,
    PASS,
    PID,
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
from profcallbacks.detect.worker_sampler import WORKER_LOOP, StackSampler

_clock = time.perf_counter


_ROW = struct.Struct(f"{FIELDS - 1}d")  # a row's fields after SEQ
_SEQ = struct.Struct("d")


class _Worker:
    """This worker's timing state (one per worker process)."""

    def __init__(self, ring: WorkerRing, worker: int) -> None:
        self.ring, self.worker = ring, worker
        self.control = ring.control
        self.on = memoryview(ring.control).cast("B").cast("d")  # items read without numpy
        self._bytes = memoryview(ring.records[worker]).cast("B")  # one struct write per row
        self.passes = 0
        self.seq = 0
        self.current: list[float] | None = None  # the batch being built
        self.sent: dict[int, list[float]] = {}  # put, not yet sent (the feeder thread's)
        self.sending: list[float] | None = None
        self.phase = "idle"  # what the main thread does now: idle, fetch, collate, send
        self.sampler: StackSampler | None = None

    def commit(self, row: list[float]) -> None:
        """Write ``row`` to the ring, ``SEQ`` last (only the feeder thread commits)."""
        self.seq += 1
        offset = ((self.seq - 1) % RING) * FIELDS * 8
        _ROW.pack_into(self._bytes, offset + 8, *row[PASS:])
        _SEQ.pack_into(self._bytes, offset, self.seq)


_STATE: _Worker | None = None


class WorkerInit:
    """The ``worker_init_fn`` of a timed pass: the user's own first, then the hooks.

    Args:
        user: The loader's own ``worker_init_fn`` (``None``: none).
        ring: The pass's shared memory.
        sampler: Set the stack sampler up too (:mod:`~profcallbacks.detect.worker_sampler`).
    """

    def __init__(self, user: Callable[[int], None] | None, ring: WorkerRing, *,
                 sampler: bool = True) -> None:
        self.user, self.ring, self.sampler = user, ring, sampler

    def __call__(self, worker_id: int) -> None:
        started = _clock()
        if self.user is not None:
            self.user(worker_id)
        head = self.ring.heads[worker_id]
        head[STARTED], head[READY], head[PID] = started, _clock(), os.getpid()
        try:
            _install(self.ring, worker_id, sampler=self.sampler)
            head[STATUS] = OK
        except Exception:  # a torch whose worker loop differs: untimed, the main process says so
            head[STATUS] = FAILED


class TimedCollate:
    """The loader's ``collate_fn`` in a timed pass: the user's, with its start and end noted.

    Args:
        inner: The loader's own ``collate_fn``.
    """

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, batch: Any) -> Any:
        state = _STATE
        row = state.current if state is not None else None
        if row is None or state is None:
            return self.inner(batch)
        row[T_COLLATE0] = _clock()
        state.phase = "collate"
        try:
            return self.inner(batch)
        finally:
            row[T_COLLATE1] = _clock()
            state.phase = "send"


def _install(ring: WorkerRing, worker: int, *, sampler: bool) -> None:
    global _STATE
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != WORKER_LOOP:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        raise RuntimeError("torch's worker loop is not among the callers")
    index_queue: Any = frame.f_locals["index_queue"]
    data_queue: Any = frame.f_locals["data_queue"]
    if not isinstance(data_queue, multiprocessing.queues.Queue):
        raise RuntimeError("the worker's result queue is not a multiprocessing Queue")
    state = _STATE = _Worker(ring, worker)
    # on this worker's own queue objects: instance attributes over their methods
    setattr(index_queue, "get", _timed_get(index_queue.get, state))  # noqa: B010
    setattr(data_queue, "put", _timed_put(data_queue.put, state))  # noqa: B010
    setattr(data_queue, "_send_bytes", _timed_send(getattr(data_queue, "_send_bytes"), state))  # noqa: B009,B010
    multiprocessing.queues._ForkingPickler = _timed_pickler(  # type: ignore[attr-defined]
        multiprocessing.queues._ForkingPickler, state)  # type: ignore[attr-defined]
    if sampler:
        try:
            state.sampler = StackSampler(state, plumbing=[os.path.abspath(__file__)])
        except Exception:  # SIGPROF taken, or no setitimer here: timed, not sampled
            state.sampler = None


def _timed_get(get: Callable[..., Any], state: _Worker) -> Callable[..., Any]:
    def timed_get(*args: Any, **kwargs: Any) -> Any:
        state.phase = "idle"
        r = get(*args, **kwargs)
        sampler = state.sampler
        if sampler is not None and bool(state.on[SAMPLING]) != sampler.armed:
            sampler.update()  # only when the main process changed its mind
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], int):
            if state.on[TIMING]:
                row = [0.0] * 9
                row[PASS], row[IDX], row[T_GET] = state.passes, r[0], _clock()
                state.current = row
                state.phase = "fetch"
            else:
                state.current = None
        elif r is not None and type(r).__name__ == "_ResumeIteration":
            state.passes += 1  # persistent workers: the next pass's indices count from 0 again
        return r
    return timed_get


def _timed_put(put: Callable[..., Any], state: _Worker) -> Callable[..., Any]:
    def timed_put(obj: Any, *args: Any, **kwargs: Any) -> Any:
        row, state.current = state.current, None
        if row is None:  # an untimed batch
            state.phase = "idle"
            return put(obj, *args, **kwargs)
        if row is not None and isinstance(obj, tuple) and obj and obj[0] == row[IDX]:
            row[T_PUT] = _clock()
            if row[T_COLLATE1] == 0.0:  # no collate call (an error, an iterable's end)
                row[T_COLLATE0] = row[T_COLLATE1] = row[T_PUT]
            state.sent[int(row[IDX])] = row  # (a dict's item set and pop hold the GIL)
        state.phase = "idle"
        return put(obj, *args, **kwargs)
    return timed_put


def _timed_pickler(pickler: Any, state: _Worker) -> Any:
    class TimedPickler:
        loads = staticmethod(pickler.loads)

        @staticmethod
        def dumps(obj: Any, protocol: int | None = None) -> Any:
            if not state.sent or not isinstance(obj, tuple) or not obj:  # untimed: as it was
                return pickler.dumps(obj, protocol)
            row = state.sent.pop(obj[0], None) if isinstance(obj[0], int) else None
            start = _clock()
            out = pickler.dumps(obj, protocol)
            if row is not None:
                row[T_SEND0] = start
                state.sending = row
            return out
    return TimedPickler


def _timed_send(send: Callable[..., Any], state: _Worker) -> Callable[..., Any]:
    def timed_send(*args: Any, **kwargs: Any) -> Any:
        if state.sending is None:  # an untimed batch
            return send(*args, **kwargs)
        try:
            return send(*args, **kwargs)
        finally:
            row, state.sending = state.sending, None
            if row is not None:
                row[T_SEND1] = _clock()
                state.commit(row)
    return timed_send
