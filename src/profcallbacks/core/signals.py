"""Signals stay the job's: held across a profiler start or stop, then delivered as the job wants.

Stopping kineto half way (a ``KeyboardInterrupt`` or a ``SystemExit`` raised by the job's
SIGTERM handler in the middle of ``stop_trace``) leaves the profiler enabled, and the process
may crash at exit. :func:`held_signals` holds SIGINT and SIGTERM for such a block and afterwards
re-delivers each one that came to the job's own disposition: an ignored signal is never touched
(it stays ignored), a handler of the job runs exactly once, the default acts as it would have
(SIGTERM ends the process, SIGINT raises ``KeyboardInterrupt``).

:class:`TerminationGuard` makes the default SIGTERM (Slurm and torchrun preemption) end a run's
profiling cleanly: while a window is open, or while the end of the run waits for its exports,
and SIGTERM has its default disposition, a SIGTERM first runs a clean-up (the profiler stopped,
what it recorded published as ``-partial``, step summaries written, the run marker given back),
then the default disposition is restored and the signal delivered again: the process still
ends by SIGTERM, as the launcher expects. A handler the job installed (or ``SIG_IGN``) is never
replaced.

Example:
    >>> with held_signals():
    ...     pass  # a signal arriving here is delivered after the block
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

HELD = (signal.SIGINT, signal.SIGTERM)
"""The signals held across a profiler start or stop."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then re-deliver them (main thread only).

    Ignored signals and handlers installed outside Python are left alone.
    """
    if not _main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[signal.Signals, Any] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    try:
        for sig in HELD:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current is None:  # ignored, or not Python's to set
                continue
            previous[sig] = signal.signal(sig, hold)
    except ValueError:  # not the main interpreter
        pass
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler)
        for signum in dict.fromkeys(caught):  # each signal once, to the job's own disposition
            signal.raise_signal(signum)


class TerminationGuard:
    """While armed, a SIGTERM with the default disposition first runs ``clean_up``.

    Args:
        clean_up: Called once, on the main thread, when SIGTERM arrives (it must be bounded in
            time: the launcher's grace period before SIGKILL is short).
        message: Logged as a warning when SIGTERM arrives (what the clean-up saves).

    Example:
        >>> guard = TerminationGuard(lambda: None)
        >>> guard.arm(); guard.disarm()
    """

    def __init__(self, clean_up: Callable[[], None], *,
                 message: str = "what the run recorded is written") -> None:
        self._clean_up = clean_up
        self._message = message
        self._armed = False

    def arm(self) -> None:
        """Take SIGTERM if it has the default disposition (the job did not set one)."""
        if self._armed or not _main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return  # the job's own handler, or ignored: never replaced
            signal.signal(signal.SIGTERM, self._on_term)
        except ValueError:
            return
        self._armed = True

    def disarm(self) -> None:
        """Give SIGTERM back its default disposition, if it is still ours."""
        if not self._armed:
            return
        self._armed = False
        with contextlib.suppress(ValueError):
            if signal.getsignal(signal.SIGTERM) == self._on_term:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.disarm()
        log.warning("profcallbacks: SIGTERM: %s before the process ends.", self._message)
        try:
            self._clean_up()
        except Exception as exc:  # the job's termination goes ahead whatever happens here
            log.warning("profcallbacks: cleaning up at SIGTERM failed (%s: %s).",
                        type(exc).__name__, exc)
        finally:
            signal.raise_signal(signal.SIGTERM)  # the default disposition: the process ends
