"""Reads what was appended to a JSON-lines file since the last read, tolerating rotation and
half-written lines."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # optional: orjson parses a long backlog (the first read of a long run) 2-4x faster
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _loads = json.loads


@dataclass
class TailBatch:
    """What one ``JsonlTail.read`` found.

    Attributes:
        rows: The complete JSON-object lines appended since the last read.
        reset: The file was truncated or replaced since the last read: rows read before are stale.
        bad_lines: Complete lines that were not JSON objects (skipped).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    reset: bool = False
    bad_lines: int = 0


class JsonlTail:
    """Follows one JSON-lines file: each ``read`` returns only the lines completed since the last.

    A line without its newline yet (a writer in the middle of a write, or a job killed mid-line) is
    held back until it is complete. A file that shrinks or is replaced (new inode: log rotation) is
    read again from its start, and the batch says ``reset``.

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

    def read(self) -> TailBatch:
        batch = TailBatch()
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if (self._inode is not None and stat.st_ino != self._inode) or stat.st_size < self._offset:
                    batch.reset = True
                    self._offset, self._pending = 0, b""
                self._inode = stat.st_ino
                f.seek(self._offset)
                data = f.read()  # steps files hold one row per summary: small
        except FileNotFoundError:
            if self._inode is not None:  # removed (rotated away): start over when it comes back
                batch.reset = True
                self._inode, self._offset, self._pending = None, 0, b""
            return batch
        except OSError:
            return batch
        self._offset += len(data)
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()  # b"" after a complete line, else the half-written rest
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
