"""Reads a large trace in pieces: never the whole file in memory, only the events the report uses.

A trace of several GB once gunzipped would need that much for its bytes alone, and as much again
for its events. Here the file is gunzipped 4 MiB at a time, cut between two events of its
``traceEvents`` array (``}``, ``,`` and ``{`` with only blanks between; a cut that falls inside
an event is refused by the decoder and an earlier one is taken), and each piece is decoded into
the report's slim records. Only complete events (``"ph": "X"``) are kept, Python-frame events
(``with_stack``) in a compact table until the end, when those around a runtime call (the only
ones the report reads besides step, loader, optimizer and collective markers) become records
(``frames.py``), and names are interned. Given ``take`` (``traces.ModelBuilder.add``), each
piece's kept events go straight into the trace's model and are let go with the piece (given
``sift`` too, the piece's plain CPU operators go into it first, as decoded): memory
grows with what the model keeps of the events the report reads, at about ``BYTES_PER_EVENT``
per event kept as an object and a third of that per CPU operator (kept as table rows), never
with the file. A trace with more than ``event_limit()`` of those (the fixed
``MAX_STREAM_EVENTS``, or fewer where half the memory available when reading begins holds fewer)
is beyond what the report reads: it says so, naming the file and the limit, instead of running
the machine out of memory.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profcallbacks.core.trace_names import (
    CPU_OP,
    MARKED_PREFIXES,
    OLD_CATEGORIES,
    PYTHON_FUNCTION,
    RUNTIME_CATEGORIES,
    USER_ANNOTATION,
)
from profcallbacks.report.model.flops import COUNTED
from profcallbacks.report.read.decode import _RAW, MISSING, Args, Event, Trace, decode_events
from profcallbacks.report.read.files import (
    MAX_GZIP_RATIO,
    RATIO_FLOOR,
    ReadError,
    gzip_problem,
    open_regular,
)
from profcallbacks.report.read.frames import FrameTable

MAX_STREAM_EVENTS = 10_000_000
"""Most events the report keeps from one trace, whatever the memory (see :func:`event_limit`)."""
BYTES_PER_EVENT = 200
"""Peak memory per kept event held as an object (a kernel, copy, runtime call, step or loader
range with its scan row; measured: 150-210 bytes retained per kept event on seven real GPU
traces, V100 to MI300X)."""
OPERATORS_PER_EVENT = 3
"""CPU operators (``cpu_op``, ``user_annotation``) counted as one kept event: they are kept as
table rows (``model/capture.py``: ``OpTable``; the summary's and the scan's columns), about 66
bytes each at the report's peak (measured: 110 MB peak RSS for a report of 10^6 small CPU
events, 44 MB for one of 2 x 10^4)."""
FRAMES_PER_EVENT = 6
"""Python frames held in ``FrameTable`` (~30 bytes each) counted as one kept event."""
MEMORY_SHARE = 0.5
"""Share of the memory available when the report starts that one trace may take."""
MAX_STREAM_BYTES = 64 << 30
"""Most bytes read from one trace once gunzipped (64 GiB); a gzip bomb stops here."""
_CHUNK = 2 << 20
"""Bytes gunzipped and decoded at a time: a piece's events exist all at once (~5x its bytes)
before those the report does not read are let go."""
_OPERATOR_CATEGORIES = frozenset({CPU_OP, USER_ANNOTATION}) | {
    c for c, new in OLD_CATEGORIES.items() if new == CPU_OP}
_RUNTIME_ANY_GENERATION = RUNTIME_CATEGORIES | {c for c, new in OLD_CATEGORIES.items()
                                                if new in RUNTIME_CATEGORIES}
_COUNTED = frozenset(COUNTED)
_NO_SHAPES: Any = _RAW(b"null") if _RAW is not None else None
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_HEAD_LIMIT = 64 << 20
_TAIL_TRIES = 64
Take = Callable[[list[Any]], None]
"""What receives each piece's kept events (``traces.ModelBuilder.add``)."""
Sift = Callable[[list[Any], Callable[[list[Any]], list[Any]]], int]
"""What may see each piece as decoded instead (``traces.ModelBuilder.sift``): it takes the CPU
operators it uses as they are, their shapes copied where it keeps them (returns how many), and
hands the other events, in runs and in file order, to its second argument (:meth:`_Kept.keep`),
which returns those the report reads."""


def available_bytes() -> int | None:
    """Memory this process may still take (bytes): the system's ``MemAvailable``, less where a
    cgroup (v2) limit leaves less; ``None`` where neither can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", "rb") as f:
            current = int(f.read().strip())
        if limit != b"max":
            found.append(max(int(limit) - current, 0))
    except (OSError, ValueError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            return None
    return min(found)


def event_limit(share: float = MEMORY_SHARE) -> tuple[int, int | None]:
    """Most events one trace may keep here: ``MAX_STREAM_EVENTS``, or fewer where ``share``
    of the available memory holds fewer (at ``BYTES_PER_EVENT`` each).

    Returns:
        ``(events, available bytes)``; the bytes are ``None`` where unknown.
    """
    available = available_bytes()
    if available is None:
        return MAX_STREAM_EVENTS, None
    return min(MAX_STREAM_EVENTS, int(available * share) // BYTES_PER_EVENT), available


class _Kept:
    """The events kept so far, and how many the cap let go."""

    def __init__(self, path: Path, max_events: int, take: Take | None = None,
                 available: int | None = None, share: float = MEMORY_SHARE,
                 sift: Sift | None = None) -> None:
        self.path, self.max_events, self.take, self.sift = path, max_events, take, sift
        self.available = available  # bytes of memory free when reading began, when it bounds
        self.share = share  # of ``available`` this trace may take
        self.events: list[Any] = []  # what is kept when no ``take`` consumes the pieces
        self.count = 0  # events kept (or handed to ``take``) so far
        self.operators = 0  # of which CPU operators (see ``OPERATORS_PER_EVENT``)
        self.frames = FrameTable()
        self.offset = 0  # where in the file the unread buffer starts (bytes, gunzipped)

    def add(self, batch: list[Any]) -> None:
        """Takes a decoded piece: through ``sift`` when given (the CPU operators it takes as
        they are count as kept), else kept (:meth:`keep`) and handed to ``take``.

        Raises:
            ReadError: The events kept so far are beyond ``max_events``.
        """
        if self.sift is not None:
            taken = self.sift(batch, self.keep)
            self.count += taken
            self.operators += taken
        elif self.take is not None:
            self.take(self.keep(batch))
        else:
            self.events += self.keep(batch)
        if self.weight() > self.max_events:
            memory = f"~{self.max_events * BYTES_PER_EVENT >> 20:,} MiB of memory"
            if self.available is not None:
                memory += (f", {self.share:.0%} of the {self.available >> 20:,} MiB available "
                           "when it began")
            raise ReadError(self.path, f"beyond what the report reads: more than {self.max_events:,} "
                            f"events it would keep ({memory}); open it in Perfetto's trace "
                            "processor, read it on a machine with more memory, or capture fewer "
                            "steps (ByteBudget(capture_bytes=...))")

    def keep(self, batch: list[Any]) -> list[Any]:
        """The events of ``batch`` the report reads (counted as kept), names interned; Python
        frames go to the frame table instead."""
        intern = sys.intern
        events: list[Any] = []
        operators = 0
        for event in batch:
            if isinstance(event, Event):
                if event.ph != "X":
                    continue
                name = event.name
                if type(name) is str:
                    if event.cat == PYTHON_FUNCTION and not name.startswith(MARKED_PREFIXES):
                        self.frames.add(event)
                        continue
                    event.name = name = intern(name)
                    if event.cat in _RUNTIME_ANY_GENERATION:
                        self.frames.call(event)
                cat = event.cat
                if type(cat) is str:
                    event.cat = cat = intern(cat)
                    if cat in _OPERATOR_CATEGORIES:
                        operators += 1
                args = event.args
                if isinstance(args, Args) and _RAW is not None:  # a Raw is a view that would
                    if name in _COUNTED:  # keep the whole piece alive: copied, the piece is freed
                        args.dims, args.concrete = args.dims.copy(), args.concrete.copy()
                    else:  # shapes are read only to count an operator's FLOPs
                        args.dims = args.concrete = _NO_SHAPES
            events.append(event)
        self.count += len(events)
        self.operators += operators
        return events

    def weight(self) -> int:
        """The events kept so far, CPU operators and Python frames counted at their share of
        one (``OPERATORS_PER_EVENT``, ``FRAMES_PER_EVENT``)."""
        return (self.count - self.operators + self.operators // OPERATORS_PER_EVENT
                + self.frames.count // FRAMES_PER_EVENT)

    def finish(self) -> None:
        """Adds the frames around runtime calls (read at the end, when every call is known)."""
        frames = self.frames.around_calls()
        if self.take is not None:
            self.take(frames)
        else:
            self.events += frames


def stream_trace(path: Path, *, max_events: int | None = None,
                 max_bytes: int = MAX_STREAM_BYTES, take: Take | None = None,
                 sift: Sift | None = None, readers: int = 1) -> Trace:
    """The slim ``Trace`` of ``path`` (gzipped or not), read piece by piece.

    ``take``, when given, receives each piece's kept events in file order (the frames around
    runtime calls last) and the events are not kept: the ``Trace`` returned holds only the
    top-level blocks. ``sift``, when given with ``take``, sees each piece first (``Sift``: the
    plain CPU operators go into the model without the filter's work) and ``take`` receives only
    the frames. ``readers``: traces read at once by this process's caller, each taking that part
    of ``MEMORY_SHARE``; ``max_events``, when given, bounds the events instead.

    Raises:
        ReadError: Not a Chrome trace, truncated, or beyond ``max_events`` / ``max_bytes``.
    """
    import gzip
    import zlib

    fd, size = open_regular(path)
    gz = path.suffix == ".gz"
    if size == 0:
        os.close(fd)
        raise ReadError(path, "empty file")
    if gz:  # a gzip bomb stops here, as in read_bytes
        max_bytes = min(max_bytes, max(size * MAX_GZIP_RATIO, RATIO_FLOOR))
    available = None
    share = MEMORY_SHARE / max(readers, 1)
    if max_events is None:
        max_events, available = event_limit(share)
        if max_events == MAX_STREAM_EVENTS:
            available = None  # the fixed cap bounds it, not the memory
    kept = _Kept(path, max_events, take, available, share, sift)
    read = 0
    try:
        with open(fd, "rb") as raw:
            stream: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            buf = bytearray()
            match = None
            while match is None:
                chunk = stream.read(_CHUNK)
                read += len(chunk)
                if not chunk and not buf.strip():
                    raise ReadError(path, "empty file" + (" (after gunzip)" if gz else ""))
                if not chunk or len(buf) > _HEAD_LIMIT:
                    raise ReadError(path, "not a Chrome trace (no traceEvents array)")
                buf += chunk
                match = _ARRAY_KEY.search(buf)
            head = bytes(buf[:match.start()])
            del buf[:match.end()]
            kept.offset = match.end()
            _take_pieces(buf, kept)
            while chunk := stream.read(_CHUNK):
                read += len(chunk)
                if read > max_bytes:
                    raise ReadError(path, f"more than {max_bytes >> 20} MiB" + (
                        f" once gunzipped ({size} bytes on disk: a gzip bomb?)" if gz else "")
                        + "; not read")
                buf += chunk
                _take_pieces(buf, kept)
            blocks = _finish(buf, head, kept, path)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ReadError(path, gzip_problem(exc)) from None
    except OSError as exc:
        raise ReadError(path, exc.strerror or str(exc)) from None
    return Trace(traceEvents=kept.events, profcallbacks=blocks.get("profcallbacks"),
                 distributedInfo=blocks.get("distributedInfo"),
                 deviceProperties=blocks.get("deviceProperties"))


def _take_pieces(buf: bytearray, kept: _Kept) -> None:
    """Decode the complete events at the start of ``buf`` and remove them from it."""
    for cut in _last_cuts(buf, max(0, len(buf) - (1 << 20))):  # the last boundary, unless it
        batch = decode_events(memoryview(buf)[:cut.start() + 1])  # falls inside an event
        if batch is not None:
            kept.add(batch)
            kept.offset += cut.end() - 1
            del buf[:cut.end() - 1]  # the next event's "{" stays
            return


def _last_cuts(buf: bytearray, start: int, most: int = 8) -> list[re.Match[bytes]]:
    """The last ``most`` boundaries between two events (``_BOUNDARY``) in ``buf`` from ``start``
    on, the last first: found from the end back, each ``}`` tried (no scan of the whole window)."""
    cuts: list[re.Match[bytes]] = []
    end = len(buf)
    while len(cuts) < most:
        at = buf.rfind(b"}", start, end)
        if at < 0:
            break
        cut = _BOUNDARY.match(buf, at)
        if cut is not None:
            cuts.append(cut)
        end = at
    return cuts


def _finish(buf: bytearray, head: bytes, kept: _Kept, path: Path) -> dict[str, Any]:
    """Decode the last events and the blocks after the array; returns the top-level blocks."""
    end = len(buf)
    first: tuple[int, json.JSONDecodeError] | None = None  # the blocks after the last "]"
    for _ in range(_TAIL_TRIES):
        end = buf.rfind(b"]", 0, end)
        if end < 0:
            break
        tail = bytes(buf[end + 1:])
        try:
            blocks = json.loads(head + b'"traceEvents":[]' + tail)
        except json.JSONDecodeError as exc:
            first = first or (end, exc)
            continue
        except ValueError:
            continue
        body = bytes(buf[:end]).strip()
        batch = decode_events(body) if body else []
        if batch is not None and isinstance(blocks, dict):
            kept.add(batch)
            kept.finish()
            return blocks
    if first is not None and decode_events(bytes(buf[:first[0]]).strip() or b"0") is not None:
        at = first[1].pos - len(head) - len(b'"traceEvents":[]')  # in what follows the array
        if at >= 0:
            return _invalid(path, kept.offset + first[0] + 1 + at, first[1].msg)
    try:  # the array's unread part as JSON: where it stops being JSON, if it does
        json.loads(b"[" + bytes(buf))
    except json.JSONDecodeError as exc:
        if exc.pos <= len(buf):
            return _invalid(path, kept.offset + exc.pos - 1, exc.msg)
        return _invalid(path, kept.offset + len(buf), "the file ends inside its traceEvents "
                                                      "array (truncated?)")
    except (ValueError, RecursionError):
        pass
    raise ReadError(path, "not a complete Chrome trace (its traceEvents array never ends; "
                          "truncated?)")


def _invalid(path: Path, at: int, why: str) -> Any:
    raise ReadError(path, f"invalid JSON at byte {at}: {why}")


__all__ = ["MISSING", "stream_trace"]
