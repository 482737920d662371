"""The main process's pin-memory thread, timed per batch (``DataLoader(pin_memory=True)``).

With ``pin_memory=True`` on a machine with an accelerator, a thread of the main process takes each
batch from the workers' result queue, copies its tensors to pinned memory and puts it on the queue
the training loop reads. :func:`time_pinning` wraps those two queue objects of one iterator
(``_worker_result_queue.get`` and ``_data_queue.put``, as instance attributes: no other loader is
touched), so each batch's pinning is noted from the moment the thread took it to the moment it
handed it on; the worker timing counts it as the batch's ``pin`` part and no longer as transfer.

Example:
    >>> import queue
    >>> source, sink, times = queue.Queue(), queue.Queue(), []
    >>> time_queues(source, sink, lambda idx, start, end: times.append(idx))
    >>> source.put((3, "batch")); sink.put(source.get()); times
    [3]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Pinned = Callable[[int, float, float], None]
"""Told of each pinned batch: its index in the pass, and when its pinning began and ended
(``perf_counter`` seconds)."""


def time_pinning(iterator: Any, pinned: Pinned) -> bool:
    """Time the pin thread of ``iterator`` (a ``DataLoader``'s); ``False``: it pins nothing."""
    if not getattr(iterator, "_pin_memory", False) or not hasattr(iterator, "_pin_memory_thread"):
        return False
    time_queues(iterator._worker_result_queue, iterator._data_queue, pinned)
    return True


def time_queues(source: Any, sink: Any, pinned: Pinned) -> None:
    """Note when each ``(idx, batch)`` left ``source`` and when it entered ``sink``."""
    clock = time.perf_counter
    taken: dict[int, float] = {}
    get, put = source.get, sink.put

    def timed_get(*args: Any, **kwargs: Any) -> Any:
        r = get(*args, **kwargs)
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], int):
            taken[r[0]] = clock()
        return r

    def timed_put(r: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(r, tuple) and r and isinstance(r[0], int):
            start = taken.pop(r[0], None)
            if start is not None:  # a retried put (a full queue) counts once
                pinned(r[0], start, clock())
        return put(r, *args, **kwargs)

    source.get, sink.put = timed_get, timed_put
