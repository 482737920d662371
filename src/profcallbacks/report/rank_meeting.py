"""The ranks of an srun step meet through files in the directory they all read.

Each rank writes what it has to say whole (a temporary name, then a rename) as
``.profcallbacks-summarize-<job>.<restart>.<step>.<rank>``; rank 0 waits for every rank's file,
reads them and removes them (a file of another owner, or a link, is never taken). No process
group is made, so nothing is left for an exiting interpreter to clean up: a gloo group met
through torch's ``FileStore`` left its file behind now and then (torch removes it in the last
store's destructor, which does not always run at exit).

Example:
    >>> d = getfixture("tmp_path")
    >>> post(d, 1, {"written": 2})
    >>> post(d, 0, {"written": 3})
    >>> collect(d, 2)
    {0: {'written': 3}, 1: {'written': 2}}
    >>> sorted(p.name for p in d.iterdir())
    []
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from profcallbacks.core.safefs import (
    create_exclusive,
    fresh_name,
    is_own,
    read_regular,
    remove_own,
    write_all,
)

log = logging.getLogger(__name__)

WAIT_S = 1800.0
"""How long rank 0 waits for the other ranks' files (a rank that died never writes one)."""
_POLL_S = 0.05
_MAX_BYTES = 1 << 20


def meeting_name(rank: int) -> str:
    """``rank``'s file name, from the Slurm job, its restart count and the step (alphanumerics)."""
    parts = [os.environ.get(k, "0") for k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID")]
    return ".profcallbacks-summarize-" + ".".join(
        "".join(c for c in p if c.isalnum()) for p in parts) + f".{rank}"


def post(directory: Path, rank: int, message: Any) -> None:
    """Write ``message`` (JSON) as ``rank``'s file in ``directory``, whole.

    Raises:
        OSError: The file system refused; no file is left behind.
    """
    temp = directory / (fresh_name(f".{meeting_name(rank)}.") + ".writing")
    try:
        fd = create_exclusive(temp)
        try:
            write_all(fd, json.dumps(message).encode())
        finally:
            os.close(fd)
        os.replace(temp, directory / meeting_name(rank))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def collect(directory: Path, world_size: int, wait_s: float = WAIT_S) -> dict[int, Any]:
    """Every rank's message by rank, once all ``world_size`` have written theirs (or ``wait_s``
    has passed: the missing ones are logged and left out); their files are removed."""
    found: dict[int, Any] = {}
    deadline = time.monotonic() + wait_s
    while True:
        for rank in range(world_size):
            if rank in found:
                continue
            path = directory / meeting_name(rank)
            if not is_own(path, kind="file"):  # not written yet, or another user's: not taken
                continue
            try:
                found[rank] = json.loads(read_regular(path, max_bytes=_MAX_BYTES))
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                log.warning("profcallbacks: rank %d's counts unreadable (%s)", rank, exc)
                found[rank] = None
            remove_own(path, inside=directory)
        if len(found) == world_size or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    missing = [r for r in range(world_size) if r not in found]
    if missing:
        log.warning("profcallbacks: no counts from rank(s) %s within %.0f s", missing, wait_s)
    return {r: m for r, m in sorted(found.items()) if m is not None}
