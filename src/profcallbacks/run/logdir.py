"""Preparing a run's log directory: a clear error at ``open()`` instead of a failure mid-training.

The names written under it are :mod:`profcallbacks.layout`'s; this module only checks that they
can be written (a directory, writable, paths short enough, no planted links).

Example:
    >>> meta = prepare_logdir(getfixture("tmp_path") / "exp1")
    >>> meta.name, meta.is_dir()
    ('profcallbacks', True)
"""

from __future__ import annotations

import os
from pathlib import Path

from profcallbacks.core.safefs import UnsafeEntryError, ensure_dir, fresh_name, warn_if_shared, write_new
from profcallbacks.layout import META_DIR

PATH_MARGIN = 256
"""Bytes the deepest file written under the log directory adds to its path (a staged raw trace:
staging, a private directory named after the capture and the worker, kineto's temporary name)."""


def path_max(logdir: Path) -> int:
    """The longest path in bytes the file system holding ``logdir`` accepts (4096 if unknown)."""
    probe = logdir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(os.pathconf(probe, "PC_PATH_MAX"))
    except (OSError, ValueError):
        return 4096


def prepare_logdir(logdir: Path) -> Path:
    """Create ``logdir/profcallbacks`` and check both can be written; return the latter.

    Raises:
        NotADirectoryError: ``logdir`` is a file.
        ValueError: ``logdir`` is too long for the files written under it.
        PermissionError: ``logdir`` is not writable, or holds a planted link.
    """
    if logdir.exists() and not logdir.is_dir():
        raise NotADirectoryError(f"logdir={str(logdir)!r} is a file; pass a directory path "
                                 "(it is created if missing).")
    longest = len(os.fsencode(os.path.abspath(logdir))) + PATH_MARGIN
    if longest > path_max(logdir):
        raise ValueError(f"logdir={str(logdir)!r} is too long: the files profcallbacks writes "
                         f"under it need paths of up to {longest} bytes, beyond the system's "
                         f"{path_max(logdir)}; pass a shorter log directory.")
    meta = logdir / META_DIR
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        ensure_dir(meta)  # a real directory: never a link planted in a shared logdir
        for where in (logdir, meta):  # captures and TensorBoard write to the root, the files to meta
            probe = where / fresh_name(".write-test-")  # a name nobody could plant in advance
            write_new(probe, b"ok")
            probe.unlink()
    except UnsafeEntryError as exc:
        raise PermissionError(f"logdir={str(logdir)!r} cannot be used: {exc.strerror}. Remove "
                              f"{str(meta)!r} or pass a log directory of your own.") from exc
    except OSError as exc:
        raise PermissionError(f"logdir={str(logdir)!r} is not writable ({exc.strerror}); pass a "
                              "directory this process can write to.") from exc
    warn_if_shared(logdir)
    return meta
