"""Python frames (``with_stack`` traces) kept compactly while a trace is read.

A ``with_stack`` trace holds several Python frames per operator, most of the events of the file;
the report reads a frame only to say which Python line a blocking runtime call ran in (the
innermost frame around it on its thread). So frames are kept as three arrays per thread while
the trace is read (about 24 bytes a frame instead of a record of ~200), and at the end only the
frames around a runtime call's start on the same thread become records again: what a reader of
the whole file would find around those calls, in a fraction of the memory.

Example:
    >>> table = FrameTable()
    >>> table.add(Event(ph="X", cat="python_function", name="a.py(3): f", pid=1, tid=1, ts=0.0, dur=9.0))
    >>> table.call(Event(ph="X", cat="cuda_runtime", name="cudaMemcpy", pid=1, tid=1, ts=4.0, dur=1.0))
    >>> [e.name for e in table.around_calls()]
    ['a.py(3): f']
"""

from __future__ import annotations

import bisect
import sys
from array import array
from typing import Any

from profcallbacks.core.trace_names import PYTHON_FUNCTION
from profcallbacks.report.read.decode import MISSING, Event


class FrameTable:
    """Frames per thread (``ts``, ``dur`` in us, names interned) and runtime calls' starts."""

    def __init__(self) -> None:
        self._frames: dict[tuple[Any, Any], tuple[array, array, list[str]]] = {}
        self._calls: dict[tuple[Any, Any], list[float]] = {}
        self.count = 0

    def add(self, event: Any) -> None:
        """Keeps frame ``event`` (a decoded ``Event`` of category ``python_function``)."""
        ts, dur = event.ts, event.dur
        if type(ts) not in (int, float) or type(dur) not in (int, float):
            return  # not a frame the report could place
        key = (_key(event.pid), _key(event.tid))
        rows = self._frames.get(key)
        if rows is None:
            rows = self._frames[key] = (array("d"), array("d"), [])
        rows[0].append(ts)
        rows[1].append(dur)
        rows[2].append(sys.intern(event.name))
        self.count += 1

    def call(self, event: Any) -> None:
        """Notes a runtime call (its thread and start): the frames around it are kept."""
        if type(event.ts) in (int, float):
            self._calls.setdefault((_key(event.pid), _key(event.tid)), []).append(event.ts)

    def around_calls(self) -> list[Any]:
        """Records of the frames that enclose the start of a runtime call on their thread."""
        out: list[Any] = []
        for key, (starts, durs, names) in self._frames.items():
            calls = sorted(self._calls.get(key, ()))
            if not calls:
                continue
            for i, ts in enumerate(starts):
                j = bisect.bisect_left(calls, ts)
                if j < len(calls) and calls[j] <= ts + durs[i]:
                    pid, tid = (MISSING if part is None else part for part in key)
                    out.append(Event(ph="X", cat=PYTHON_FUNCTION, name=names[i], pid=pid, tid=tid,
                                     ts=_number(ts), dur=_number(durs[i])))
        return out


def _key(value: Any) -> Any:
    """A pid or tid as a dict key (``None`` for a missing one)."""
    if value is MISSING:
        return None
    return value if isinstance(value, (int, str)) else str(value)


def _number(value: float) -> float | int:
    """``value`` as the trace wrote it: whole microseconds stay ints (as the JSON decoder gives)."""
    return int(value) if value.is_integer() else value
