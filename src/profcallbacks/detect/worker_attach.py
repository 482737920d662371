"""Worker timing for loaders that a framework iterates itself (Lightning's and HF's Trainers).

``StepProfiler.wrap`` makes each pass's iterator itself (:meth:`LoaderWorkers.iterate`); a Trainer
calls ``iter(loader)`` inside its own loop. :class:`LoaderHooks` times those passes too: on the
loader instance it sets ``_get_iterator`` (which ``DataLoader.__iter__`` calls to start workers)
to one that begins the pass as :meth:`LoaderWorkers.begin` does, and on the iterator it makes,
``_next_data`` (the main process's wait for each batch, the worker timing's
:meth:`LoaderWorkers.fetched`) and ``_reset`` (a further pass of persistent workers). accelerate's
``DataLoaderShard`` (the HF Trainer's) is followed to the ``DataLoader`` it wraps.
:meth:`LoaderHooks.detach` removes every hook (the session closes): nothing of ours stays on the
user's loader. Loaders without workers are left alone.

Example:
    >>> from torch.utils.data import DataLoader
    >>> from profcallbacks.detect.loader_workers import LoaderWorkers
    >>> hooks = LoaderHooks(LoaderWorkers(lambda: 0))
    >>> loader = DataLoader(range(4), batch_size=2)
    >>> hooks.attach(loader); "_get_iterator" in vars(loader)  # no workers: nothing set
    False
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

_HOOKED = ("_next_data", "_reset")


class Timed(Protocol):
    """What the hooks tell of each pass and batch (the
    :class:`~profcallbacks.detect.loader_workers.LoaderWorkers`)."""

    @property
    def off(self) -> bool: ...

    def begin(self, loader: Any, make: Callable[[], Iterator[Any]]) -> Iterator[Any]: ...

    def fetched(self, start: float, end: float) -> None: ...

    def resumed(self, loader: object) -> None: ...


class LoaderHooks:
    """Sets and removes the timing hooks of loaders a framework iterates (module docstring).

    Args:
        workers: The session's worker timing, told of each pass and each batch's wait.
    """

    def __init__(self, workers: Timed) -> None:
        self._workers = workers
        self._loaders: weakref.WeakSet[Any] = weakref.WeakSet()
        self._iterators: weakref.WeakSet[Any] = weakref.WeakSet()

    def attach(self, loader: object, make: Callable[[], Iterator[Any]] | None = None) -> None:
        """Time the passes the framework begins over ``loader`` from now on (idempotent);
        ``make``: what makes its iterator (default: its own ``_get_iterator``)."""
        from torch.utils.data import DataLoader

        inner = getattr(loader, "__dict__", {}).get("base_dataloader", loader)  # accelerate's
        if (self._workers.off or not isinstance(inner, DataLoader) or not inner.num_workers
                or "_get_iterator" in vars(inner)):
            return
        made: Callable[[], Iterator[Any]] = make or inner._get_iterator

        def get_iterator() -> Iterator[Any]:
            iterator = self._workers.begin(inner, made)
            self._hook(inner, iterator)
            return iterator

        inner._get_iterator = get_iterator  # type: ignore[method-assign,assignment]
        self._loaders.add(inner)

    def _hook(self, loader: Any, iterator: Any) -> None:
        if not all(hasattr(iterator, name) for name in _HOOKED) or self._workers.off:
            return
        clock = time.perf_counter
        next_data, reset = iterator._next_data, iterator._reset

        def timed_next_data() -> Any:
            start = clock()
            data = next_data()
            self._workers.fetched(start, clock())
            return data

        def timed_reset(*args: Any, **kwargs: Any) -> None:
            self._workers.resumed(loader)  # before the reset sends the new pass's first indices
            reset(*args, **kwargs)

        iterator._next_data, iterator._reset = timed_next_data, timed_reset
        self._iterators.add(iterator)

    def adopt(self, early: LoaderHooks) -> None:
        """The hooks ``early`` set report to this object's worker timing from now on."""
        early._workers = self._workers
        self._loaders |= early._loaders
        self._iterators |= early._iterators

    def detach(self) -> None:
        """Remove every hook from the loaders and their iterators."""
        for loader in list(self._loaders):
            vars(loader).pop("_get_iterator", None)
        for iterator in list(self._iterators):
            for name in _HOOKED:
                vars(iterator).pop(name, None)
        self._loaders = weakref.WeakSet()
        self._iterators = weakref.WeakSet()


class FirstPass:
    """Times the pass a Trainer begins before its session exists: Lightning makes its first
    iterator in its data set-up, after the ``setup`` hook and before ``on_train_start``.

    Between :meth:`start` and :meth:`stop`, ``DataLoader._get_iterator`` attaches the
    loaders ``chosen`` says are the training loaders (:meth:`LoaderHooks.attach`) before making
    their iterator; every other loader is untouched. The session's worker timing then takes
    the pass over (:meth:`LoaderWorkers.take_over`).

    Args:
        hooks: The hooks of the (early) worker timing that times the pass.
        chosen: Whether a loader is a training loader.
    """

    def __init__(self, hooks: LoaderHooks, chosen: Callable[[Any], bool]) -> None:
        self._hooks, self._chosen = hooks, chosen
        self._original: Any = None
        self._installed: Any = None

    def start(self) -> None:
        from torch.utils.data import DataLoader

        if self._installed is not None:
            return
        original = self._original = DataLoader._get_iterator
        hooks, chosen = self._hooks, self._chosen

        def get_iterator(loader: Any) -> Iterator[Any]:
            try:
                if "_get_iterator" not in vars(loader) and chosen(loader):
                    hooks.attach(loader, lambda: original(loader))
            except Exception:  # never worth the training: the loader goes on untimed
                pass
            own = vars(loader).get("_get_iterator")
            return own() if own is not None else original(loader)

        self._installed = get_iterator
        DataLoader._get_iterator = get_iterator  # type: ignore[method-assign,assignment]

    def stop(self) -> None:
        from torch.utils.data import DataLoader

        if self._installed is not None and DataLoader._get_iterator is self._installed:
            DataLoader._get_iterator = self._original  # type: ignore[method-assign]
        self._installed = None
