"""Claims on staged entries: what each live process stages is never taken for a killed run's.

The ranks of one run share the log directory's staging, and rank 0 finishes at its start what
an earlier, killed run left there (``trace_writer.recover_staging``). A rank that started first
(rank 0 was slower to import, or its node later to start) may have staged files already, so an
entry's age does not tell whose it is. Each process that stages holds a claim: the file
``<staging>/.claim-<token>`` naming its host, process id and the capture stages it writes into
(listed before it creates them), and its raw traces live in directories named
``.raw-<token>-...``. Recovery leaves alone whatever a live claim covers: one whose process is
alive on this host, or, from another host (which cannot be asked), one written or refreshed
within ``CLAIM_STALE_S`` seconds before the run started.

A claim also names the captures its process still owes a trace file (``owes``): a training
process from the start of a window until its export helper has written the file, the helper
while it writes it. A rank publishing a capture at the end of the run waits while a live claim
owes that capture a file (a slower rank, not a fixed time), and publishes it once, complete; a
file no live process owes (its rank was killed) is not waited for, and the capture is published
as partial at once and said to be.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from profcallbacks.core.processes import pid_alive
from profcallbacks.core.safefs import ensure_dir, fresh_name, open_dir, read_regular, write_new
from profcallbacks.layout import STAGING_DIR

log = logging.getLogger(__name__)

CLAIM_PREFIX = ".claim-"
CLAIM_FILE = re.compile(r"^\.claim-([0-9a-f]{12})$")
RAW_TOKEN = re.compile(r"^\.raw-([0-9a-f]{12})-")
"""The token in a raw trace's directory name (``.raw-<token>-<capture>-<worker>-XXXXXX``)."""
CLAIM_STALE_S = 90.0
"""A claim from another host not refreshed for this long belongs to a process that is gone."""
_MAX_CLAIM_BYTES = 1 << 20


class StagingClaim:
    """One process's claim on what it stages in a log directory.

    Example:
        >>> import tempfile
        >>> claim = StagingClaim(Path(tempfile.mkdtemp()))
        >>> claim.add("step000005-schedule")
        >>> staging = claim.logdir / ".profcallbacks-staging"
        >>> live_claims(staging, started=float("inf"))[claim.token]
        ['step000005-schedule']
        >>> claim.release(); live_claims(staging, started=float("inf"))
        {}
    """

    def __init__(self, logdir: Path, token: str | None = None) -> None:
        self.logdir = logdir
        self.token = token or uuid.uuid4().hex[:12]
        self._stages: list[str] = []
        self._owes: list[str] = []
        self._written = token is not None  # a claim made elsewhere (to release it)
        self._lock = threading.RLock()  # the export reader thread pays what is owed

    @property
    def raw_prefix(self) -> str:
        """Name prefix of this process's raw trace directories."""
        return f".raw-{self.token}-"

    def hold(self) -> None:
        """Write the claim (before a raw trace is saved); also refreshes its time."""
        self._write()

    def add(self, stage: str) -> None:
        """Claim the capture stage ``stage`` (before creating or writing into it)."""
        if stage not in self._stages:
            self._stages.append(stage)
        self._write()

    def drop(self, stage: str) -> None:
        """``stage`` holds nothing of this process's any more (published or discarded)."""
        if stage in self._stages:
            self._stages.remove(stage)
            self._write()

    def owe(self, capture: str) -> None:
        """This process will write a trace file of ``capture`` (a directory name, ``-partial``
        or not): ranks publishing it wait for that file while this process lives."""
        key = owed_key(capture)
        with self._lock:
            if key not in self._owes:
                self._owes.append(key)
                self._write()

    def paid(self, capture: str) -> None:
        """The trace file of ``capture`` is written (or will never be); never raises."""
        key = owed_key(capture)
        with self._lock:
            if key in self._owes:
                self._owes.remove(key)
                if self._written:  # never written again once released
                    with contextlib.suppress(OSError):
                        self._write_now()

    def release(self) -> None:
        """Remove the claim, and staging when that leaves it empty; never raises."""
        with self._lock:
            self._owes.clear()
            if not self._written:
                return
            staging = self.logdir / STAGING_DIR
            with contextlib.suppress(OSError):
                os.unlink(staging / f"{CLAIM_PREFIX}{self.token}")
            with contextlib.suppress(OSError):  # only when empty: another rank may still stage
                staging.rmdir()
            self._written = False

    def _write(self) -> None:
        """Replace the claim file in one rename: a reader sees the old claim or the new one."""
        with self._lock:
            self._write_now()

    def _write_now(self) -> None:
        staging = self.logdir / STAGING_DIR
        ensure_dir(staging, own=True)
        data = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "stages": self._stages, "owes": self._owes}).encode()
        tmp = fresh_name(f"{CLAIM_PREFIX}{self.token}.")
        fd = open_dir(staging)
        try:
            write_new(tmp, data, dir_fd=fd)
            os.replace(tmp, f"{CLAIM_PREFIX}{self.token}", src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)
        self._written = True


def owed_key(capture: str) -> str:
    """What a claim owes for capture directory ``capture``: its name without ``-partial`` (a rank
    that stopped early publishes into the partial directory of the same window)."""
    return capture.removesuffix("-partial")


def owed_elsewhere(staging: Path, capture: str, *, mine: tuple[str, ...] = ()) -> list[str]:
    """Tokens of the live claims in ``staging`` (``mine`` left out) that still owe ``capture`` a
    trace file; never raises."""
    key = owed_key(capture)
    return [token for token, claim in _claims(staging, started=time.time()).items()
            if token not in mine and key in _strings(claim.get("owes"))]


def live_claims(staging: Path, *, started: float) -> dict[str, list[str]]:
    """The live claims in ``staging``: token -> the stages it names.

    ``started``: when the reading run started, by the file server's clock (a claim from another
    host is live when written within ``CLAIM_STALE_S`` seconds before it). Claims of processes
    that are gone are removed. Never raises.
    """
    return {token: _strings(claim.get("stages"))
            for token, claim in _claims(staging, started=started).items()}


def _strings(value: Any) -> list[str]:
    return [s for s in value if isinstance(s, str)] if isinstance(value, list) else []


def _claims(staging: Path, *, started: float) -> dict[str, dict[str, Any]]:
    """The live claims in ``staging`` (token -> its content); removes those of processes gone."""
    live: dict[str, dict[str, Any]] = {}
    try:
        names = os.listdir(staging)
    except OSError:
        return live
    for name in names:
        match = CLAIM_FILE.match(name)
        if match is None:
            continue
        path = staging / name
        try:
            claim = json.loads(read_regular(path, max_bytes=_MAX_CLAIM_BYTES))
            mtime = os.lstat(path).st_mtime
        except (OSError, ValueError):
            continue  # being replaced, or not ours: not counted, not removed
        if _alive(claim, mtime, started):
            live[match.group(1)] = claim
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return live


def _alive(claim: Any, mtime: float, started: float) -> bool:
    if not isinstance(claim, dict):
        return False
    pid = claim.get("pid")
    if claim.get("host") != socket.gethostname() or not isinstance(pid, int):
        return mtime > started - CLAIM_STALE_S
    return pid_alive(pid)
