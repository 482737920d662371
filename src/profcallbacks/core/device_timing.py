"""Step time as the GPU saw it: CUDA events recorded at step ends, read only once completed."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class DeviceStepTimer:
    """Records a CUDA event at each step end and turns completed pairs into step times (ms).

    ``collect()`` only reads events whose work is done (``event.query()``), so timing never makes
    the host wait for the device: nothing here is a sync point. Steps across a ``break_chain()``
    (a pause for validation or checkpointing) are not timed.

    Example:
        >>> timer = DeviceStepTimer()                   # doctest: +SKIP
        >>> for _ in range(3):                          # doctest: +SKIP
        ...     train_step(); timer.mark()              # at each step end
        >>> timer.collect()                             # doctest: +SKIP
        [10.2, 10.1]
    """

    def __init__(self, max_pending: int = 4096) -> None:
        self._pending: deque[Any] = deque(maxlen=max_pending)
        self._last: Any = None

    @staticmethod
    def wanted() -> bool:
        """CUDA is there and initialised (the job uses it)."""
        return torch.cuda.is_available() and torch.cuda.is_initialized()

    def mark(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending.append(event)

    def break_chain(self) -> None:
        self._pending.append(None)

    def scalars(self) -> dict[str, float]:
        """Mean device step time (ms) of the steps completed since the last call."""
        times = self.collect()
        return {"device_step_time_ms": sum(times) / len(times)} if times else {}

    def collect(self) -> list[float]:
        """Milliseconds between consecutive step ends whose events have completed."""
        times = []
        pending = self._pending
        while pending and (pending[0] is None or pending[0].query()):
            event = pending.popleft()
            if event is not None and self._last is not None:
                times.append(self._last.elapsed_time(event))
            self._last = event
        return times


class DeviceClock:
    """The host clock that also records each step's CUDA event (:class:`DeviceStepTimer`).

    The device timing's one fallback: the first failure of the timer (marking or reading)
    turns it off for the rest of the run with one warning; the host clock goes on.

    Example:
        >>> clock = DeviceClock(lambda: 1.5, timer=None)  # a timer that failed earlier
        >>> clock(), clock.scalars()
        (1.5, {})
    """

    def __init__(self, clock: Callable[[], float], timer: DeviceStepTimer | None = None) -> None:
        self._clock = clock
        self.timer = timer if timer is not None else None

    def __call__(self) -> float:
        """The clock, after recording the step's CUDA event (read lazily, never synchronised)."""
        timer = self.timer
        if timer is not None:
            try:
                timer.mark()
            except Exception as exc:
                self._failed(exc)
        return self._clock()

    def break_chain(self) -> None:
        """Steps across this point (a pause) are not timed."""
        if self.timer is not None:
            self.timer.break_chain()

    def scalars(self) -> dict[str, float]:
        """``device_step_time_ms`` of the steps completed since the last call (or nothing)."""
        if self.timer is None:
            return {}
        try:
            return self.timer.scalars()
        except Exception as exc:
            self._failed(exc)
            return {}

    def _failed(self, exc: Exception) -> None:
        log.warning("profcallbacks: CUDA step timing failed (%s); it is off.", exc)
        self.timer = None
