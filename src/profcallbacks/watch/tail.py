"""Reads what was appended to a JSON-lines file since the last read, tolerating rotation and
half-written lines."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any

try:  # optional: orjson parses a long backlog (the first read of a long run) 2-4x faster
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _loads = json.loads


MAX_READ_BYTES = 16 << 20
"""Most bytes read per poll: a huge backlog is read from its last 16 MiB."""
MAX_LINE_BYTES = 1 << 20
"""A line longer than this without its newline is dropped (no steps row is that long)."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass
class TailBatch:
    """What one ``JsonlTail.read`` found.

    Attributes:
        rows: The complete JSON-object lines appended since the last read.
        reset: The file was truncated or replaced since the last read: rows read before are stale.
        bad_lines: Complete lines that were not JSON objects (skipped).
        refused: The path is a link, a FIFO, a device or unreadable: nothing was read.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    reset: bool = False
    bad_lines: int = 0
    refused: bool = False
    """Not a regular file (a FIFO, a device, a link): not read."""


class JsonlTail:
    """Follows one JSON-lines file: each ``read`` returns only the lines completed since the last.

    A line without its newline yet (a writer in the middle of a write, or a job killed mid-line) is
    held back until it is complete. A file that shrinks or is replaced (new inode: log rotation) is
    read again from its start, and the batch says ``reset``. Only a regular file is read (opened
    non-blocking, never through a link), at most :data:`MAX_READ_BYTES` per read.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "rank0.steps.jsonl"
        >>> _ = path.write_text('{"last_step": 9}\\n{"last_step": 1')  # the writer is mid-line
        >>> tail = JsonlTail(path)
        >>> tail.read().rows
        [{'last_step': 9}]
        >>> with path.open("a") as f:
        ...     _ = f.write("9}\\n")
        >>> tail.read().rows
        [{'last_step': 19}]
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._inode: int | None = None
        self._pending = b""
        self._skip_partial = False

    def read(self) -> TailBatch:
        batch = TailBatch()
        try:  # never through a link, never blocking on a FIFO, never a device
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            if self._inode is not None:  # removed (rotated away): start over when it comes back
                batch.reset = True
                self._inode, self._offset, self._pending = None, 0, b""
            return batch
        except OSError:  # a link (ELOOP), no permission: not read
            batch.refused = True
            return batch
        try:
            stat = os.fstat(fd)
            if not S_ISREG(stat.st_mode):
                batch.refused = True
                return batch
            if (self._inode is not None and stat.st_ino != self._inode) or stat.st_size < self._offset:
                batch.reset = True
                self._offset, self._pending = 0, b""
            self._inode = stat.st_ino
            if stat.st_size - self._offset > MAX_READ_BYTES:  # a huge backlog: its latest part
                self._offset, self._pending = stat.st_size - MAX_READ_BYTES, b""
                self._skip_partial = True
            data = os.pread(fd, MAX_READ_BYTES, self._offset)
        except OSError:
            return batch
        finally:
            os.close(fd)
        self._offset += len(data)
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()  # b"" after a complete line, else the half-written rest
        if self._skip_partial and lines:  # read from the middle of a line: not a row
            self._skip_partial = False
            lines.pop(0)
        if len(self._pending) > MAX_LINE_BYTES:  # no row is this long (zeros, a binary file)
            self._pending = b""
            batch.bad_lines += 1
        for line in lines:
            if not line.strip():
                continue
            try:
                row = _loads(line)
            except ValueError:
                batch.bad_lines += 1
                continue
            if isinstance(row, dict):
                batch.rows.append(row)
            else:
                batch.bad_lines += 1
        return batch
