"""Notebook re-runs: a profiler abandoned by an exception gives its log directory back.

When training raises inside a notebook cell, a front end whose framework calls no end hook (the
HF Trainer) leaves its session open: the run marker held, maybe a torch.profiler still
recording, and IPython keeps the exception (so nothing is collected). A session is abandoned
when the interactive shell has reported an uncaught exception (``sys.last_exc`` /
``sys.last_value``, set by IPython and the standard ``code`` module) since it opened. A new
session on the same log directory in the same process closes an abandoned one first, with one
warning, instead of failing with ``LogdirInUseError`` naming this very process; a live one
(e.g. a second profiler opened by mistake inside the first one's loop) is left alone. A session
collected while open closes itself the same way (``ProfilingSession.__del__``).

Example:
    >>> class Session:
    ...     is_open = True
    ...     def close(self, *, failed: bool = False) -> None:
    ...         self.is_open = False
    >>> first, second = Session(), Session()
    >>> take_over(Path("runs/x"), first)
    >>> sys.last_value = RuntimeError("the cell raised")  # as the interactive shell does
    >>> take_over(Path("runs/x"), second)
    >>> first.is_open
    False
    >>> del sys.last_value
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class Closable(Protocol):
    @property
    def is_open(self) -> bool: ...

    def close(self, *, failed: bool = False) -> None: ...


_open: dict[str, tuple[weakref.ref[Closable], int]] = {}
"""Log directory -> the session open on it and the shell's last uncaught exception then."""


def _last_uncaught() -> int:
    """Identity of the last exception an interactive shell reported (0: none)."""
    value = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return id(value) if value is not None else 0


def take_over(logdir: Path, session: Closable) -> None:
    """Record ``session`` as the one open on ``logdir``, closing an abandoned earlier one."""
    key = os.path.realpath(logdir)
    ref, seen = _open.get(key, (None, 0))
    earlier = ref() if ref is not None else None
    if (earlier is not None and earlier is not session and earlier.is_open
            and _last_uncaught() not in (0, seen)):
        log.warning("profcallbacks: an earlier profiler on %s in this process was never closed "
                    "(its training raised, e.g. in a notebook cell); it is closed now, what it "
                    "was capturing is published as -partial, and the new one takes over.", logdir)
        try:
            earlier.close(failed=True)
        except Exception as exc:  # the new run starts whatever the old one left
            log.warning("profcallbacks: closing the earlier profiler failed (%s: %s).",
                        type(exc).__name__, exc)
    _open[key] = (weakref.ref(session), _last_uncaught())


def release(logdir: Path, session: Closable) -> None:
    """``session`` closed: ``logdir`` has no open session of this process any more."""
    key = os.path.realpath(logdir)
    ref, _ = _open.get(key, (None, 0))
    if ref is not None and ref() in (session, None):
        del _open[key]
