"""On-demand captures of a running job: a file named CAPTURE dropped into the log directory."""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

from profcallbacks.layout import CAPTURE_FILE
from profcallbacks.options.bounds import MAX_CAPTURE_STEPS

log = logging.getLogger(__name__)

MAX_CAPTURE_FILE_BYTES = 64
"""Most bytes read from a CAPTURE file; a larger file is not a step count and is ignored."""
_STEP_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only: "²".isdigit() is True, int() fails


class CaptureFileTrigger:
    """Notices ``<logdir>/CAPTURE``, reads an optional step count from it, and removes it.

    Checked at most once per ``poll_s`` seconds, so the cost per step is one comparison. The
    training thread never blocks on the file and never reads more than
    ``MAX_CAPTURE_FILE_BYTES``: it is opened non-blocking and only a regular file is read (a FIFO,
    a device or a directory named CAPTURE is ignored with one warning). An empty file asks for
    the configured ``capture_steps``; a count above ``MAX_CAPTURE_STEPS`` is lowered to it; any
    other content is ignored with one warning. ``poll`` never raises.

    Example:
        >>> trigger = CaptureFileTrigger(Path("runs/exp1"), poll_s=1.0)
        >>> trigger.poll(now=0.0)  # no file: None
    """

    def __init__(self, logdir: Path, *, poll_s: float) -> None:
        self.path = logdir / CAPTURE_FILE
        self._poll_s = poll_s
        self.next_poll = float("-inf")
        self._ignored: tuple[int, int, int] | None = None  # (dev, inode, mtime) warned about

    def poll(self, now: float) -> int | None:
        """Returns the requested step count (0 for the default) once per file, else None."""
        if now < self.next_poll:
            return None
        self.next_poll = now + self._poll_s
        try:
            return self._check()
        except Exception as exc:  # e.g. an NFS error: this poll is skipped, the next one retries
            self._ignore(None, f"it could not be read ({type(exc).__name__}: {exc})")
            return None

    def _check(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # e.g. no permission
            self._ignore(os.lstat(self.path), f"it cannot be opened ({exc.strerror or exc})")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._ignore(st, "it is not a regular file", remove=not stat.S_ISDIR(st.st_mode))
                return None
            if st.st_size > MAX_CAPTURE_FILE_BYTES:
                self._ignore(st, f"it holds {st.st_size} bytes, not a step count")
                return None
            data = os.read(fd, MAX_CAPTURE_FILE_BYTES + 1)
        finally:
            os.close(fd)
        self._remove()
        text = data.decode("utf-8", errors="replace").strip()
        if not text:
            return 0
        if not _STEP_COUNT.fullmatch(text) or int(text) < 1:
            self._ignore(st, f"it holds {text[:20]!r}, not a step count of at least 1",
                         remove=False)
            return None
        steps = int(text)
        if steps > MAX_CAPTURE_STEPS:
            log.warning("profcallbacks: %s asks for %d steps; capturing %d, the most one capture "
                        "records (take several captures for more).", self.path, steps,
                        MAX_CAPTURE_STEPS)
            return MAX_CAPTURE_STEPS
        return steps

    def _ignore(self, st: os.stat_result | None, why: str, *, remove: bool = True) -> None:
        """One warning per bad file; removing it is tried so it is not seen again."""
        key = None if st is None else (st.st_dev, st.st_ino, st.st_mtime_ns)
        if key is None or key != self._ignored:
            log.warning("profcallbacks: ignored %s: %s. Write a step count such as 5 (or nothing, "
                        "for the configured capture_steps) into a regular file; captures go on.",
                        self.path, why)
        self._ignored = key
        if remove and st is not None:
            self._remove()

    def _remove(self) -> None:
        try:
            os.remove(self.path)
        except OSError:
            pass
