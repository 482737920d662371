"""File operations for a log directory others may write to: never follow a link we did not make.

On a shared (group- or world-writable) log directory any entry with a predictable name can be a
link planted by another user. Everything here refuses links, other users' files and anything but
regular files and directories, so the library never writes, appends, reads or deletes outside
the log directory:

- :func:`create_exclusive` / :func:`write_new`: a new file (``O_CREAT|O_EXCL|O_NOFOLLOW``), with
  the user's umask.
- :func:`open_append`: an existing file only when it is a regular file owned by this user with no
  other name (one hard link: a second name may lie outside the log directory).
- :func:`make_private_dir`: a directory of an unpredictable name (``mkdtemp``, mode 0700) for
  files written by path by code we do not control (kineto's trace save).
- :func:`ensure_dir`, :func:`open_dir`: a real directory, never a link to one; ``dir_fd``-relative
  operations below it cannot be redirected by renaming a parent.
- :func:`is_own`, :func:`remove_own`, :func:`remove_own_tree`: clean-up that touches only what it
  can prove is ours (no link, our uid, the expected kind and name, inside the given root).
- :func:`read_regular`: a regular file read non-blocking, refused before reading when too large.

Every function takes a ``Path`` and, optionally, ``dir_fd`` (then the path is relative to it).

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> write_new(root / "a.txt", b"hi")
    >>> (root / "b.txt").symlink_to(root / "a.txt")
    >>> try:
    ...     os.close(open_append(root / "b.txt"))
    ... except UnsafeEntryError as exc:
    ...     print(exc.reason)
    a link (not followed)
    >>> remove_own(root / "a.txt", kind="file", inside=root), (root / "a.txt").exists()
    (True, False)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_warned_shared: set[str] = set()

PathArg = Path | str


class UnsafeEntryError(OSError):
    """An entry is a link, not a regular file or directory, or not owned by this user."""

    def __init__(self, path: PathArg, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {reason}; not used")
        self.path = Path(path)
        self.reason = reason


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def _refusal(st: os.stat_result, kind: str) -> str | None:
    """Why ``st`` is not our own ``kind`` ("file" or "dir"), else None."""
    if stat.S_ISLNK(st.st_mode):
        return "a link (not followed)"
    wanted = stat.S_ISREG if kind == "file" else stat.S_ISDIR
    if not wanted(st.st_mode):
        return f"not a {'regular file' if kind == 'file' else 'directory'}"
    if _uid() >= 0 and st.st_uid != _uid():
        return f"owned by another user (uid {st.st_uid})"
    return None


def create_exclusive(path: PathArg, *, dir_fd: int | None = None, append: bool = False) -> int:
    """A new file opened for writing: fails if anything (a file, a link) already has the name.

    Raises:
        FileExistsError: The name is taken.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    return os.open(path, flags | (os.O_APPEND if append else 0), 0o666, dir_fd=dir_fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_new(path: PathArg, data: bytes, *, dir_fd: int | None = None) -> None:
    """Create ``path`` exclusively and write ``data``; a failed write leaves no file behind."""
    fd = create_exclusive(path, dir_fd=dir_fd)
    try:
        write_all(fd, data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path, dir_fd=dir_fd)
        raise
    os.close(fd)


def open_append(path: PathArg, *, dir_fd: int | None = None) -> int:
    """``path`` opened for appending: created if missing, else only a regular file of ours.

    Raises:
        UnsafeEntryError: The name is a link, a FIFO, a device, a directory, or another user's.
    """
    try:
        return create_exclusive(path, dir_fd=dir_fd, append=True)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _NONBLOCK | _CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # link; FIFO; directory
            st = _lstat(path, dir_fd)
            raise UnsafeEntryError(path, (_refusal(st, "file") if st else None)
                                   or "not a regular file") from None
        raise
    st = os.fstat(fd)
    reason = _refusal(st, "file") or (f"a file with {st.st_nlink} hard links (another name of a file "
                                      "that may lie outside the log directory)"
                                      if st.st_nlink != 1 else None)
    if reason is not None:
        os.close(fd)
        raise UnsafeEntryError(path, reason)
    return fd


def open_dir(path: PathArg, *, dir_fd: int | None = None) -> int:
    """A descriptor of the directory ``path``, never of a link to one (for ``dir_fd=`` use).

    Raises:
        UnsafeEntryError: ``path`` is a link or not a directory.
    """
    try:
        return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = _lstat(path, dir_fd)
            reason = "a link (not followed)" if st and stat.S_ISLNK(st.st_mode) else "not a directory"
            raise UnsafeEntryError(path, reason) from None
        raise


def ensure_dir(path: PathArg, *, dir_fd: int | None = None, own: bool = False) -> bool:
    """Create the directory ``path`` if missing (its parent must exist); True when created here.

    An existing entry must be a real directory (not a link to one) and, with ``own``, ours.

    Raises:
        UnsafeEntryError: The name is taken by a link, a file or (``own``) another user's directory.
    """
    try:
        os.mkdir(path, 0o777, dir_fd=dir_fd)
        return True
    except FileExistsError:
        pass
    st = _lstat(path, dir_fd)
    if st is None:
        raise UnsafeEntryError(path, "removed while being created")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or own:
        reason = _refusal(st, "dir")
        if reason is not None:
            raise UnsafeEntryError(path, reason)
    return False


def make_private_dir(parent: Path, prefix: str) -> Path:
    """A new directory of an unpredictable name in ``parent`` (mode 0700): nobody else can plant
    anything inside it, so code that writes by path (and may follow links) is safe there."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def fresh_name(prefix: str) -> str:
    """``prefix`` and 16 random hex digits: a name nobody can plant in advance."""
    return prefix + os.urandom(8).hex()


def is_own(path: PathArg, *, kind: str, inside: Path | None = None, name: re.Pattern[str] | None
           = None, dir_fd: int | None = None) -> bool:
    """``path`` is provably ours: no link, our uid, a ``kind`` ("file" or "dir") entry, a name
    matching ``name`` and, with ``inside``, within that directory once links are resolved."""
    if name is not None and not name.match(Path(path).name):
        return False
    st = _lstat(path, dir_fd)
    if st is None or _refusal(st, kind) is not None:
        return False
    if inside is not None and dir_fd is None:
        real, root = os.path.realpath(path), os.path.realpath(inside)
        return os.path.commonpath([real, root]) == root and real != root
    return True


def remove_own(path: PathArg, *, kind: str = "file", inside: Path | None = None,
               name: re.Pattern[str] | None = None, dir_fd: int | None = None) -> bool:
    """Remove ``path`` (a file, or an empty directory) if :func:`is_own`; True when removed."""
    if not is_own(path, kind=kind, inside=inside, name=name, dir_fd=dir_fd):
        return False
    try:
        if kind == "dir":
            os.rmdir(path, dir_fd=dir_fd)
        else:
            os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_own_tree(path: Path, *, inside: Path, name: re.Pattern[str] | None = None) -> bool:
    """Remove the directory ``path`` with its own files and directories; True when all is gone.

    Only entries that are ours are removed (regular files and directories of our uid, never
    followed through a link; files whose name matches ``name`` when given). Anything else stays,
    and so does the directory holding it.
    """
    if not is_own(path, kind="dir", inside=inside):
        return False
    try:
        fd = open_dir(path)
    except OSError:
        return False
    try:
        clean = _clear(fd, name)
    finally:
        os.close(fd)
    if not clean:
        return False
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _clear(fd: int, name: re.Pattern[str] | None) -> bool:
    clean = True
    for entry in os.listdir(fd):
        st = _lstat(entry, fd)
        if st is None:
            continue
        if _refusal(st, "dir") is None:
            try:
                child = open_dir(entry, dir_fd=fd)
            except OSError:
                clean = False
                continue
            try:
                emptied = _clear(child, name)
            finally:
                os.close(child)
            if not (emptied and _safe_remove(entry, fd, directory=True)):
                clean = False
        elif _refusal(st, "file") is None and (name is None or name.match(entry)):
            clean &= _safe_remove(entry, fd, directory=False)
        else:
            clean = False
    return clean


def _safe_remove(entry: str, dir_fd: int, *, directory: bool) -> bool:
    try:
        os.rmdir(entry, dir_fd=dir_fd) if directory else os.unlink(entry, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def read_regular(path: PathArg, *, max_bytes: int, dir_fd: int | None = None,
                 follow: bool = False) -> bytes:
    """The content of a regular file, opened non-blocking and refused before reading when larger
    than ``max_bytes``. ``follow=False`` refuses a link too.

    Raises:
        UnsafeEntryError: Not a regular file (a FIFO, a device, a directory) or a link.
        OSError: Missing, unreadable, or larger than ``max_bytes`` (``EFBIG``).
    """
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeEntryError(path, "a link (not followed)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeEntryError(path, "not a regular file (a FIFO, device or directory)")
        if st.st_size > max_bytes:
            raise OSError(errno.EFBIG, f"{path}: {st.st_size} bytes, more than the "
                          f"{max_bytes} read at most; not read")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:  # it grew while read
            raise OSError(errno.EFBIG, f"{path}: more than {max_bytes} bytes; not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def warn_if_shared(logdir: Path) -> bool:
    """Warn once per directory when others may write into ``logdir``; True when they may.

    Group-writable counts when the group is not the user's own primary (private) group."""
    try:
        st = os.stat(logdir)
    except OSError:
        return False
    group = st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid()  # not a user private group
    if not (st.st_mode & stat.S_IWOTH or group):
        return False
    key = os.path.realpath(logdir)
    if key not in _warned_shared:
        _warned_shared.add(key)
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        log.warning("profcallbacks: logdir=%r is writable by %s: another user could plant links "
                    "or files in it. profcallbacks never follows a link it did not make, but "
                    "prefer a log directory only you can write to (chmod go-w).", str(logdir), who)
    return True


def _lstat(path: PathArg, dir_fd: int | None) -> os.stat_result | None:
    try:
        return os.lstat(path, dir_fd=dir_fd) if dir_fd is not None else os.lstat(path)
    except OSError:
        return None
