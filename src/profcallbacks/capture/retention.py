"""Keeps the log directory's captures within ``ByteBudget.logdir_bytes``.

After each capture is published, the capture directories of the log directory are measured
(every file in them, symlinks by their own size, never followed). While they exceed the budget,
this run's own captures go, least valuable first and oldest first within a value:

    schedule, validation  <  baseline  <  slowdown  <  memory  <  manual, file

Never the newest capture, never the newest slowdown capture (the current or last slowdown
episode), never a file this run did not write: each file is removed only if it is still the
very file (device and inode) that was published, and a directory only once it is empty. Each
removal is logged and appended to ``profcallbacks/retention.jsonl``, which the report lists.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from profcallbacks.core.safefs import open_append, remove_own, write_all
from profcallbacks.core.triggers import BASELINE, MEMORY, SCHEDULE, SLOWDOWN, VALIDATION
from profcallbacks.layout import META_DIR, parse_capture_dir, retention_log_file

log = logging.getLogger(__name__)

VALUE = {SCHEDULE: 0, VALIDATION: 0, BASELINE: 1, SLOWDOWN: 2, MEMORY: 3}
"""Triggers by value (higher: kept longer); others (manual, file) rank above all of these."""
KEPT_LONGEST = 4
_LOCK = ".retention.lock"
_STALE_LOCK_S = 120.0


@dataclass
class OwnedCapture:
    """A capture directory this run published, and the identity of each file it put there."""

    directory: Path
    trigger: str
    order: int
    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (st_dev, st_ino)


class Retention:
    """Removes this run's least valuable captures while the log directory is over budget.

    Example:
        >>> retention = Retention(Path("runs/x"), logdir_bytes=2_000_000_000)
        >>> retention.enforce()
        []
    """

    def __init__(self, logdir: Path, *, logdir_bytes: int) -> None:
        self._logdir = logdir
        self.logdir_bytes = logdir_bytes
        self._owned: list[OwnedCapture] = []

    def add(self, directory: Path, trigger: str, files: list[str]) -> None:
        """``files`` of capture ``directory`` were just published by this run."""
        owned = next((c for c in self._owned if c.directory == directory), None)
        if owned is None:
            owned = OwnedCapture(directory, trigger, len(self._owned))
            self._owned.append(owned)
        for name in files:
            with contextlib.suppress(OSError):
                st = (directory / name).lstat()
                if stat.S_ISREG(st.st_mode):
                    owned.files[name] = (st.st_dev, st.st_ino)

    def enforce(self) -> list[dict[str, object]]:
        """Remove captures until the log directory fits; returns one record per removal."""
        if not self._owned or not self._take_lock():
            return []
        try:
            return self._enforce()
        finally:
            with contextlib.suppress(OSError):
                remove_own(self._logdir / META_DIR / _LOCK, kind="dir", inside=self._logdir)

    def _enforce(self) -> list[dict[str, object]]:
        total = logdir_capture_bytes(self._logdir)
        if total <= self.logdir_bytes:
            return []
        newest = self._owned[-1]
        slowdowns = [c for c in self._owned if c.trigger == SLOWDOWN]
        protected = {id(newest)} | ({id(slowdowns[-1])} if slowdowns else set())
        candidates = sorted((c for c in self._owned if id(c) not in protected),
                            key=lambda c: (VALUE.get(c.trigger, KEPT_LONGEST), c.order))
        removed: list[dict[str, object]] = []
        for capture in candidates:
            if total <= self.logdir_bytes:
                break
            freed = _remove_owned(capture)
            self._owned.remove(capture)
            total -= freed
            record: dict[str, object] = {
                "time": round(time.time(), 3), "capture": capture.directory.name,
                "trigger": capture.trigger, "bytes": freed, "logdir_bytes": self.logdir_bytes,
                "reason": f"log directory over its budget of {self.logdir_bytes} bytes"}
            removed.append(record)
            log.info("profcallbacks: removed capture %s (%s, %.1f MB) to keep the log directory "
                     "within %.1f MB.", capture.directory.name, capture.trigger, freed / 1e6,
                     self.logdir_bytes / 1e6)
            _append_record(self._logdir, record)
        if total > self.logdir_bytes:
            log.warning("profcallbacks: the log directory's captures take %.1f MB, over the budget "
                        "of %.1f MB, and none more of this run's may go (the newest, the current "
                        "slowdown episode's, or other runs' files).", total / 1e6,
                        self.logdir_bytes / 1e6)
        return removed

    def _take_lock(self) -> bool:
        lock = self._logdir / META_DIR / _LOCK
        try:
            lock.mkdir(parents=False)
            return True
        except FileExistsError:
            with contextlib.suppress(OSError):  # a killed helper's lock: stale after 2 minutes
                if (time.time() - lock.lstat().st_mtime > _STALE_LOCK_S
                        and remove_own(lock, kind="dir", inside=self._logdir)):
                    lock.mkdir()
                    return True
            return False
        except OSError:
            return False


def logdir_capture_bytes(logdir: Path) -> int:
    """Bytes of every entry directly inside the capture directories of ``logdir`` (no links
    followed)."""
    total = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(logdir):
            if parse_capture_dir(entry.name) is None or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError), os.scandir(entry.path) as files:
                for file in files:
                    with contextlib.suppress(OSError):
                        total += file.stat(follow_symlinks=False).st_size
    return total


def _remove_owned(capture: OwnedCapture) -> int:
    """Unlink the capture's files that are still the ones published; bytes freed."""
    freed = 0
    for name, identity in capture.files.items():
        path = capture.directory / name
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
                continue  # replaced (e.g. by a link) since: not ours any more
            if remove_own(path, kind="file", inside=capture.directory.parent):
                freed += st.st_size
        except OSError:
            continue
    with contextlib.suppress(OSError):  # only when empty: files of others stay, and so does it
        remove_own(capture.directory, kind="dir", inside=capture.directory.parent)
    return freed


def _append_record(logdir: Path, record: dict[str, object]) -> None:
    path = retention_log_file(logdir)
    try:
        fd = open_append(path)  # a regular file of ours, or new: never through a link
        try:
            write_all(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("profcallbacks: could not note a removal in %s (%s).", path, exc)
