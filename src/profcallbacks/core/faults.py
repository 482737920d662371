"""Writing to a log directory that may fill up or turn read-only: name the cause, warn once, retry.

A sink never raises into training. :class:`RecoveringAppender` keeps what it could not write in
memory (bounded), undoes a half-written record, warns once per episode of failures with the cause
in words ("disk full", "read-only file system") and tries again later; the first write that works
ends the episode with one more line saying so.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from profcallbacks.core.safefs import UnsafeEntryError, open_append, write_all

log = logging.getLogger(__name__)

RETRY_S = 5.0
"""Seconds between attempts to write while a file system refuses writes."""
MAX_PENDING_BYTES = 16 << 20
"""Most bytes one sink keeps in memory while it cannot write; older records are dropped first."""

_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EIO: "I/O error",
    errno.EFBIG: "file too large",
}


def file_size_limit() -> int | None:
    """This process's largest file in bytes (``ulimit -f``, ``RLIMIT_FSIZE``), or None for none."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def filesystem_trouble(path: Path) -> str | None:
    """``"disk full"`` or ``"read-only file system"`` when the file system of ``path`` is so, else None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return "read-only file system"
    if st.f_bavail == 0 or (st.f_favail == 0 and st.f_files > 0):
        return "disk full"
    return None


def describe_error(exc: BaseException, path: Path | None = None) -> str:
    """The cause of a failed write in words, e.g. ``"disk full ([Errno 28] No space left ...)"``."""
    if isinstance(exc, UnsafeEntryError):  # a planted link or another user's file
        return str(exc)
    cause = filesystem_trouble(path) if path is not None else None
    if cause is None and isinstance(exc, OSError) and exc.errno:
        cause = _CAUSES.get(exc.errno)
    limit = file_size_limit()
    if limit is not None and (cause == "file too large" or isinstance(exc, FileNotFoundError)):
        # a writer that hit the limit (kineto's save among them: it leaves no file) says no more
        cause = f"file size limit of {limit} bytes (ulimit -f)"
    detail = f"{type(exc).__name__}: {exc}"
    return f"{cause} ({detail})" if cause else detail


class RecoveringAppender:
    """Appends records to one file; a failed write is undone, kept and retried later.

    The file is opened for each flush (``O_APPEND``, never through a link, only a regular file
    owned by this user: see :func:`~profcallbacks.core.safefs.open_append`) and closed again, so
    no descriptor stays open on a file system that is being remounted or unmounted. A record cut
    short by a full disk is truncated away, so readers never see half a line.

    Args:
        path: The file (created on the first write).
        what: Name of the data in warnings, e.g. ``"step summaries"``.
        header: Bytes written first whenever the file is (re)started empty, e.g. a format marker.
        retry_s: Seconds between write attempts after a failure.
        clock: Monotonic clock in seconds (injected by tests).

    Example:
        >>> import tempfile
        >>> out = RecoveringAppender(Path(tempfile.mkdtemp()) / "steps.jsonl", "step summaries")
        >>> out.append(b'{"steps": 50}\\n'); out.close()
        >>> out.path.read_bytes()
        b'{"steps": 50}\\n'
    """

    def __init__(self, path: Path, what: str, *, header: bytes = b"", retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._what = what
        self._header = header
        self._retry_s = retry_s
        self._clock = clock
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._dropped = 0
        self._failures = 0
        self._next_try = float("-inf")

    def append(self, record: bytes, *, flush: bool = True) -> None:
        """Queue ``record`` and write everything queued now (or, while failing, when a retry is due)."""
        self._pending.append(record)
        self._pending_bytes += len(record)
        while self._pending_bytes > MAX_PENDING_BYTES and len(self._pending) > 1:
            self._pending_bytes -= len(self._pending.popleft())
            self._dropped += 1
        if flush:
            self.flush()

    def flush(self, *, force: bool = False) -> bool:
        """Write what is queued; True when nothing is left. Never raises."""
        if not self._pending:
            return True
        if not force and self._clock() < self._next_try:
            return False
        data = b"".join(self._pending)
        try:
            self._write(data)
        except Exception as exc:  # OSError mostly; a sink never raises into training
            self._failed(exc)
            return False
        self._pending.clear()
        self._pending_bytes = 0
        if self._failures:
            log.warning("profcallbacks: writing %s to %s works again (%d attempt(s) failed%s).",
                        self._what, self.path, self._failures,
                        f", {self._dropped} oldest record(s) dropped" if self._dropped else "")
            self._failures = 0
            self._dropped = 0
        return True

    def close(self) -> None:
        """One last attempt; what still cannot be written is reported, never raised."""
        if not self.flush(force=True):
            log.warning("profcallbacks: %d record(s) of %s could not be written to %s.",
                        len(self._pending), self._what, self.path)
        self._pending.clear()
        self._pending_bytes = 0

    def _write(self, data: bytes) -> None:
        fd = open_append(self.path)  # never through a link, only into a regular file of ours
        try:
            size = os.fstat(fd).st_size
            if size == 0 and self._header:
                data = self._header + data
            try:
                write_all(fd, data)
            except BaseException:
                try:  # undo the half-written record so readers never see it
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        self._next_try = self._clock() + self._retry_s
        if self._failures == 1:
            log.warning("profcallbacks: cannot write %s to %s: %s; they are kept in memory and "
                        "retried every %.0f s, training goes on.", self._what, self.path,
                        describe_error(exc, self.path), self._retry_s)
