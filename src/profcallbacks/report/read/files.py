"""Reads (gzipped) JSON files fast, with a progress bar on long reads and errors that name the file."""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import stat
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

try:  # optional speed-up: orjson parses a trace 2-4x faster than the standard library
    import orjson

    _loads: Callable[[bytes | bytearray], Any] = orjson.loads
    PARSER = "orjson"
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _loads = json.loads
    PARSER = "json"

log = logging.getLogger(__name__)
_hinted = False
_CHUNK = 4 << 20
PROGRESS_MIN_BYTES = 4 << 20
"""Files at least this large on disk (~60 MB of trace JSON once gunzipped, a few seconds to read)
show a progress bar when stderr is a terminal."""
_HINT_MIN_BYTES = 32 << 20


class ReadError(Exception):
    """A file could not be read; ``str()`` is one sentence naming the file and the cause."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a worker process, re-raised here
        return ReadError, (self.path, self.reason)


class Progress:
    """A one-line progress bar on a terminal; silent anywhere else.

    Example:
        >>> bar = Progress("trace.json.gz", total=100, stream=None)
        >>> bar.update(50); bar.close()
    """

    def __init__(self, label: str, total: int, stream: TextIO | None) -> None:
        self._label = label[-40:]
        self._total = max(total, 1)
        self._stream = stream
        self._last = 0.0

    def update(self, done: int) -> None:
        if self._stream is None or time.monotonic() - self._last < 0.1:
            return
        self._last = time.monotonic()
        frac = min(done / self._total, 1.0)
        bar = "#" * int(frac * 30)
        self._stream.write(f"\rreading {self._label} [{bar:<30}] {frac:4.0%}")
        self._stream.flush()

    def close(self) -> None:
        if self._stream is not None and self._last:
            self._stream.write("\r" + " " * 90 + "\r")
            self._stream.flush()


def progress_stream(size: int) -> TextIO | None:
    """``sys.stderr`` when it is a terminal and ``size`` bytes take long enough to need a bar."""
    return sys.stderr if size >= PROGRESS_MIN_BYTES and sys.stderr.isatty() else None


MAX_DECOMPRESSED_BYTES = 4 << 30
"""Most bytes a trace may take once gunzipped (4 GiB)."""
MAX_GZIP_RATIO = 100
"""Most gunzipped bytes per byte on disk, above the first 64 MiB. Chrome traces compress about
17x; a gzip bomb (zeros, 1000x) is stopped here instead of filling memory."""
RATIO_FLOOR = 64 << 20
"""Gunzipped bytes read before :data:`MAX_GZIP_RATIO` applies."""
MAX_JSONL_BYTES = 1 << 30
"""Most bytes read from one steps or findings file (about 80 million steps of summaries)."""


def open_regular(path: Path) -> tuple[int, int]:
    """``(fd, size)`` of ``path`` opened non-blocking; a FIFO, device or directory is refused.

    Raises:
        ReadError: Not a regular file, or it cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ReadError(path, exc.strerror or str(exc)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ReadError(path, "not a regular file (a FIFO, device or directory); not read")
    return fd, st.st_size


def read_bytes(path: Path, *, limit: int | None = None) -> bytearray:
    """The file's content, gunzipped when its name ends in ``.gz``, read from regular files only.

    Args:
        path: The file.
        limit: Most bytes to return; default ``MAX_DECOMPRESSED_BYTES`` and, for gzip, at most
            ``MAX_GZIP_RATIO`` times the size on disk (at least 64 MiB).

    Raises:
        ReadError: The file is missing, not regular, empty, not gzip, truncated or too large.
    """
    try:
        fd, size = open_regular(path)
        if size == 0:
            os.close(fd)
            raise ReadError(path, "empty file")
        gz = path.suffix == ".gz"
        if limit is None:
            limit = MAX_DECOMPRESSED_BYTES
            if gz:
                limit = min(limit, max(size * MAX_GZIP_RATIO, RATIO_FLOOR))
        if not gz and size > limit:  # refused before reading a byte of it
            os.close(fd)
            raise ReadError(path, f"{size} bytes, more than the {limit >> 20} MiB read at most; "
                                  "not read")
        out = bytearray()
        with open(fd, "rb") as raw:
            bar = Progress(path.name, size, progress_stream(size))
            stream: Any = gzip.GzipFile(fileobj=raw) if gz else raw
            try:
                while chunk := stream.read(min(_CHUNK, limit + 1 - len(out))):
                    out += chunk
                    if len(out) > limit:
                        raise ReadError(path, f"more than {limit >> 20} MiB" + (
                            f" once gunzipped ({size} bytes on disk: a gzip bomb?)" if gz else "")
                            + "; not read")
                    bar.update(raw.tell())
            finally:
                bar.close()
    except ReadError:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ReadError(path, gzip_problem(exc)) from None
    except OSError as exc:
        raise ReadError(path, exc.strerror or str(exc)) from None
    if not out[:4096].strip() and not out.strip():  # strip() copies: only when the start is blank
        raise ReadError(path, "empty file" + (" (after gunzip)" if path.suffix == ".gz" else ""))
    return out


def parse_json(path: Path, data: bytes | bytearray) -> Any:
    """Parses ``data`` (read from ``path``) with orjson when installed, else the standard library."""
    global _hinted
    if PARSER == "json" and len(data) >= _HINT_MIN_BYTES and not _hinted:
        _hinted = True
        log.warning("profcallbacks: large trace; pip install 'profcallbacks[report]' (orjson) parses "
                    "it 2-4x faster.")
    try:
        return _loads(data)
    except ValueError as exc:  # json.JSONDecodeError, orjson.JSONDecodeError, UnicodeDecodeError
        raise ReadError(path, invalid_json(exc)) from None
    except RecursionError:
        raise ReadError(path, "invalid JSON (nested too deeply)") from None


def gzip_problem(exc: Exception) -> str:
    """What gunzipping a file met: its end too early, no gzip at all, or damaged data."""
    if isinstance(exc, EOFError):
        return ("truncated gzip file (it ends before its compressed stream does; was the job "
                "killed while writing it?)")
    if isinstance(exc, gzip.BadGzipFile) and str(exc).startswith("Not a gzipped file"):
        return "not a gzip file, although its name ends in .gz"
    return (f"corrupt gzip data ({exc}): the file was damaged after it was written (a disk or "
            "copy error?)")


def invalid_json(exc: ValueError) -> str:
    """``invalid JSON at line L column C (byte N): why`` for a parser's error.

    Example:
        >>> try:
        ...     json.loads("hello")
        ... except ValueError as exc:
        ...     invalid_json(exc)
        'invalid JSON at line 1 column 1 (byte 0): Expecting value'
    """
    msg, pos = getattr(exc, "msg", None), getattr(exc, "pos", None)
    if isinstance(msg, str) and isinstance(pos, int):
        return (f"invalid JSON at line {getattr(exc, 'lineno', '?')} column "
                f"{getattr(exc, 'colno', '?')} (byte {pos}): {msg}")
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid JSON at byte {exc.start}: not UTF-8 text"
    return f"invalid JSON ({exc})"


def read_json(path: Path) -> Any:
    """``parse_json(read_bytes(path))``."""
    return parse_json(path, read_bytes(path))


def why_not_a_trace(path: Path) -> str:
    """Why the file ``path`` is no Chrome trace: what reading it says (``invalid JSON at ...``,
    ``truncated gzip file`` ...), else that it has no ``traceEvents``."""
    try:
        data = read_json(path)
    except ReadError as exc:
        return exc.reason
    what = "an object" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
    return (f"not a Chrome trace ({what} without a traceEvents list; a trace is a .json or "
            ".json.gz file with one)")


def as_int(value: Any, default: int = -1) -> int:
    """``int(value)`` for a number read from a file, ``default`` when it is none or beyond 64 bits."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -_MAX_INT <= number < _MAX_INT else default


def read_jsonl(path: Path, problems: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; unreadable lines are noted in ``problems`` and skipped.

    A line cut short by a job killed mid-write is the usual case, so one bad line never hides the
    rest of the file.
    """
    try:
        text = read_bytes(path, limit=MAX_JSONL_BYTES).decode("utf-8", errors="replace")
    except ReadError as exc:
        if exc.reason != "empty file":
            problems.append({"file": str(path), "error": exc.reason})
        return []
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            bad.append(number)
            continue
        if isinstance(row, dict) and _sane(row, 0):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        lines = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        problems.append({"file": str(path), "error": f"skipped {len(bad)} unreadable line(s): {lines}"})
    return rows


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity, -Infinity


_MAX_INT = 1 << 63


def _sane(value: Any, depth: int) -> bool:
    """Finite numbers within 64-bit range only, and no nesting deeper than 32 levels (e.g. a step 10**400)."""
    if isinstance(value, dict):
        return depth < 32 and all(_sane(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return depth < 32 and all(_sane(v, depth + 1) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)  # 1e400 parses as inf
    if isinstance(value, int):
        return -_MAX_INT <= value < _MAX_INT
    return True
