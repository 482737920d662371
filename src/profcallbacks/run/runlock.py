"""One live run per log directory: a run marker created atomically, kept fresh, removed at close.

Two runs writing into one log directory clobber each other's captures and the report adds up
their steps, so a second run fails at start (:class:`LogdirInUseError`) naming the directory
and the fix. The marker ``<logdir>/profcallbacks/run.lock`` is created with ``O_CREAT|O_EXCL``,
which is atomic on local file systems and on NFS v3 and later (``flock``/``fcntl`` locks are not
dependable there). It names the host and process and its modification time is refreshed every
``HEARTBEAT_S`` seconds by a small thread. A marker is stale, and taken over with a warning, when
its process is gone (same host) or, from another host, it has not been refreshed for ``STALE_S``
seconds (ages are measured against the file server's own clock, so client clocks may differ). A
live process on the same host keeps its marker, also while stopped (Ctrl-Z).
Only global rank 0 takes the marker: the ranks of one run share the directory by design.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from profcallbacks.core.processes import pid_alive
from profcallbacks.core.safefs import create_exclusive, write_new
from profcallbacks.layout import run_lock_file, run_specific_file

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
"""Seconds between refreshes of the marker's modification time."""
STALE_S = 90.0
"""A marker not refreshed for this long belongs to a run that is gone."""
_MAX_MARKER_BYTES = 4096


class LogdirInUseError(RuntimeError):
    """Another live run writes into the same log directory."""


class MovableFile(Protocol):
    """A file of the run that can go on under another name (steps file, findings file)."""

    path: Path

    def move_to(self, path: Path) -> None: ...


class RunLock:
    """The run marker of one log directory.

    Example:
        >>> import tempfile
        >>> logdir = Path(tempfile.mkdtemp()); (logdir / "profcallbacks").mkdir()
        >>> lock = RunLock(logdir); lock.acquire()
        >>> lock.path.exists()
        True
        >>> lock.release(); lock.path.exists()
        False
    """

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.path = run_lock_file(logdir)
        self.host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost = threading.Event()
        self._left = False
        self.previous: dict[str, Any] | None = None
        """The marker of an earlier run that ended without closing, if one was taken over."""

    def acquire(self) -> None:
        """Create the marker, or take over a stale one.

        Raises:
            LogdirInUseError: A live run holds the marker.
        """
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "token": self._token,
                "started": time.time()}
        data = json.dumps(mine).encode()
        try:
            fd = create_exclusive(self.path)
        except FileExistsError:
            self._take_over(data)
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        self._thread = threading.Thread(target=self._beat, name="profcallbacks-run-lock",
                                        daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop refreshing and remove the marker if it is still ours; never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None
        with contextlib.suppress(OSError, ValueError):
            if _read_marker(self.path).get("token") == self._token:
                self.path.unlink()

    def _take_over(self, data: bytes) -> None:
        holder = _read_marker(self.path)
        age = _age_s(self.path)
        if not _stale(holder, age):
            who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            raise LogdirInUseError(
                f"logdir={str(self.logdir)!r} is in use by another profcallbacks run ({who}, "
                f"marker {self.path} refreshed {age:.0f} s ago). Give each run a log directory of "
                f"its own (e.g. {str(self.logdir / 'run2')!r}); if that run is gone, delete "
                f"{self.path} (one from another host is also taken over {STALE_S:.0f} s after its "
                "last refresh).")
        log.warning("profcallbacks: an earlier run in %s (pid %s on %s) ended without closing; "
                    "its marker is taken over and its captures are kept.", self.logdir,
                    holder.get("pid", "?"), holder.get("host", "?"))
        self.previous = holder
        tmp = self.path.with_name(f".{self.path.name}.{self._token}")
        write_new(tmp, data)
        os.replace(tmp, self.path)  # replaces a link itself, never what it points to
        if _read_marker(self.path).get("token") != self._token:  # another run took it over first
            raise LogdirInUseError(f"logdir={str(self.logdir)!r}: another run took over the stale "
                                   f"marker {self.path} at the same moment; give each run a log "
                                   "directory of its own.")

    @property
    def lost(self) -> bool:
        """Another run took the marker over (this one was suspended past ``STALE_S``)."""
        return self._lost.is_set()

    def check(self) -> bool:
        """Whether the marker is still ours; the first time it is not, one warning. Never raises."""
        if self._lost.is_set():
            return False
        holder = _read_marker(self.path)
        if not holder or holder.get("token") == self._token:  # ours, or gone/unreadable: no rival
            return True
        self._lost.set()
        log.warning("profcallbacks: this run lost its marker %s to another run (pid %s on %s), "
                    "probably after being suspended for longer than %.0f s; it stops writing the "
                    "log directory's shared files and writes its own to names of this run; "
                    "training goes on.", self.path, holder.get("pid", "?"), holder.get("host", "?"),
                    STALE_S)
        return False

    def leave_shared(self, files: Iterable[MovableFile | None]) -> None:
        """Once the marker is lost (another run took the log directory over while this one was
        suspended), move ``files`` to names of this run, once: the shared names are the other
        run's from then on (:meth:`check` warned). Does nothing while the marker is ours."""
        if self._left or not self._lost.is_set():
            return
        self._left = True
        run = f"{self.host}-{os.getpid()}"
        for file in files:
            if file is not None:
                file.move_to(run_specific_file(file.path, run))

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if not self.check():
                return
            with contextlib.suppress(OSError):  # a full or read-only disk: the sinks warn
                os.utime(self.path, follow_symlinks=False)


def _read_marker(path: Path) -> dict[str, Any]:
    """The marker's JSON (``{}`` when unreadable); never blocks on a FIFO, reads at most 4 KiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        raw = os.read(fd, _MAX_MARKER_BYTES)
    finally:
        os.close(fd)
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _age_s(path: Path) -> float:
    """Seconds since ``path`` was modified, by the clock of the file system that holds it."""
    probe = path.with_name(f".clock-{uuid.uuid4().hex}")
    try:
        write_new(probe, b"")
        now = probe.stat().st_mtime
        probe.unlink()
    except OSError:
        now = time.time()
    try:
        return max(now - path.lstat().st_mtime, 0.0)
    except OSError:
        return float("inf")


def _stale(holder: dict[str, Any], age_s: float) -> bool:
    """A marker whose run is gone: its process is dead on this host, or (another host, which
    cannot be asked) it has not been refreshed for ``STALE_S``. A live process on this host is
    never stale, also when stopped for a while (Ctrl-Z) and not refreshing."""
    if not holder:  # empty or unreadable: a run killed while writing it, unless just created
        return age_s > 2.0
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
        return age_s > STALE_S
    return pid != os.getpid() and not pid_alive(pid)


def claim_logdir(logdir: Path) -> RunLock:
    """Take the run marker of ``logdir`` and finish what an earlier, killed run left in staging.

    Raises:
        LogdirInUseError: A live run holds the marker.
    """
    from profcallbacks.capture.trace_writer import recover_staging

    lock = RunLock(logdir)
    lock.acquire()
    try:
        started = lock.path.stat().st_mtime  # the file server's clock
    except OSError:
        started = time.time()
    for line in recover_staging(logdir, older_than=started):
        log.warning("profcallbacks: %s: %s (left by an earlier run).", logdir, line)
    return lock
