"""On-demand captures of a running job: a file named CAPTURE dropped into the log directory."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from profcallbacks.layout import CAPTURE_FILE

log = logging.getLogger(__name__)


class CaptureFileTrigger:
    """Notices ``<logdir>/CAPTURE``, reads an optional step count from it, and removes it.

    Checked at most once per ``poll_s`` seconds, so the cost per step is one comparison.

    Example:
        >>> trigger = CaptureFileTrigger(Path("runs/exp1"), poll_s=1.0)
        >>> trigger.poll(now=0.0)  # no file: None
    """

    def __init__(self, logdir: Path, *, poll_s: float) -> None:
        self.path = logdir / CAPTURE_FILE
        self._poll_s = poll_s
        self.next_poll = float("-inf")

    def poll(self, now: float) -> int | None:
        """Returns the requested step count (0 for the default) once per file, else None."""
        if now < self.next_poll:
            return None
        self.next_poll = now + self._poll_s
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace").strip()
            os.remove(self.path)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return None
        if text.isdigit() and int(text) > 0:
            return int(text)
        if text:
            log.warning("profcallbacks: %s holds %r, not a step count; capturing the default "
                        "number of steps.", self.path, text[:40])
        return 0
