"""The summary file next to a trace: a few kilobytes that let a report skip the trace.

``<trace>.summary`` holds what the report reads of one trace (steps, breakdown, verdict,
diagnoses with their gains, collective arrival and wait times, device, throughput), written by
the export helper from the analysis it runs anyway, or by ``profcallbacks summarize``. It is tied
to its trace by the trace's size, modification time and a cheap hash (BLAKE2b of the size and the
first and last MiB): a summary whose trace changed since is stale and the trace is read instead.

The summary is written whole or not at all (a temporary name, then a rename in the same
directory, through a descriptor of that directory: never outside it).

Example:
    >>> import json, pathlib
    >>> d = getfixture("tmp_path")
    >>> trace = d / "rank0_a.4.pt.trace.json.gz"; _ = trace.write_bytes(b"x" * 10)
    >>> write_summary(d, trace.name, {"rank": 0}, tie_of(trace))
    >>> load_summary(trace).status, load_summary(trace).record["rank"]
    ('match', 0)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profcallbacks.core.json_codec import loads as loads_json
from profcallbacks.core.safefs import create_exclusive, fresh_name, open_dir, read_regular, write_all
from profcallbacks.layout import summary_file_name

SUMMARY_FORMAT = "profcallbacks-trace-summary"
SUMMARY_VERSION = 1
"""Raised when a field changes meaning; a reader takes only the versions it knows (else stale)."""
EDGE_BYTES = 1 << 20
"""The hash covers the trace's first and last this many bytes (and its size)."""
MAX_SUMMARY_BYTES = 8 << 20
"""A summary larger than this is not one of ours: not read."""
SUMMARY_KEY = "summary"
"""A live analysis's profile of a capture (``history[-1]``, ``CaptureHook``) may carry the
capture's summary record under this key: the writer writes it next to the trace."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

def trace_tie(fd: int) -> dict[str, Any]:
    """The tie of the open trace ``fd`` to its summary: size, mtime (ns) and BLAKE2b hex."""
    st = os.fstat(fd)
    digest = hashlib.blake2b(str(st.st_size).encode(), digest_size=16)
    digest.update(os.pread(fd, EDGE_BYTES, 0))
    if st.st_size > EDGE_BYTES:
        digest.update(os.pread(fd, EDGE_BYTES, max(st.st_size - EDGE_BYTES, EDGE_BYTES)))
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "blake2b": digest.hexdigest()}


def tie_of(trace: Path, *, dir_fd: int | None = None) -> dict[str, Any]:
    """``trace_tie`` of the file ``trace`` (a link is not followed).

    Raises:
        OSError: The trace cannot be opened.
    """
    fd = os.open(trace, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    try:
        return trace_tie(fd)
    finally:
        os.close(fd)


def encode_summary(record: dict[str, Any], trace_name: str, tie: dict[str, Any]) -> bytes:
    """The summary file's bytes: ``record`` with its format, version and trace tie."""
    head = {"format": SUMMARY_FORMAT, "version": SUMMARY_VERSION,
            "trace": {"file": trace_name, **tie}}
    return json.dumps({**head, **{k: v for k, v in record.items() if k not in head}},
                      separators=(",", ":"), default=str).encode()


def write_summary(directory: Path | int, trace_name: str, record: dict[str, Any],
                  tie: dict[str, Any]) -> None:
    """Write the summary of ``trace_name`` into ``directory`` (a path or a directory descriptor)
    whole: a temporary ``.writing`` file renamed over any earlier summary of that trace.

    Raises:
        ValueError: ``trace_name`` is not a plain file name (it would lead out of ``directory``).
        OSError: The file system refused; no file is left behind.
    """
    if not trace_name or "/" in trace_name or "\0" in trace_name or trace_name in (".", ".."):
        raise ValueError(f"trace_name must be a file name inside the directory, got "
                         f"{trace_name!r}")
    data = encode_summary(record, trace_name, tie)
    fd = open_dir(directory) if isinstance(directory, Path) else directory
    temp = fresh_name(f".{trace_name}.") + ".writing"
    try:
        out = create_exclusive(temp, dir_fd=fd)
        try:
            write_all(out, data)
        finally:
            os.close(out)
        os.replace(temp, summary_file_name(trace_name), src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=fd)
        raise
    finally:
        if isinstance(directory, Path):
            os.close(fd)


MATCH, STALE, MISSING = "match", "stale", "missing"


@dataclass(frozen=True)
class LoadedSummary:
    """A trace's summary as found: ``status`` ``match`` (``record`` holds it), ``stale`` (the
    trace changed, or another version wrote it: ``why``) or ``missing``."""

    status: str
    record: dict[str, Any] | None = None
    why: str = ""


def load_summary(trace: Path) -> LoadedSummary:
    """The summary of ``trace`` if it still describes the trace; never raises.

    A summary of another owner than its trace's is never taken (in a shared log directory it
    could be planted). The trace is not opened when its size and modification time are the ones the summary
    recorded; otherwise its first and last MiB are hashed and compared.
    """
    path = trace.with_name(summary_file_name(trace.name))
    try:
        data = read_regular(path, max_bytes=MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        return LoadedSummary(MISSING)
    except OSError as exc:
        return LoadedSummary(STALE, why=f"summary unreadable ({exc.strerror or exc})")
    try:
        record = loads_json(data)
        tie = record["trace"]
        if record.get("format") != SUMMARY_FORMAT or record.get("version") != SUMMARY_VERSION:
            return LoadedSummary(STALE, why=f"summary version {record.get('version')!r}, "
                                 f"this reader takes {SUMMARY_VERSION}")
        size, mtime_ns = int(tie["bytes"]), int(tie["mtime_ns"])
    except (ValueError, TypeError, KeyError) as exc:
        return LoadedSummary(STALE, why=f"summary malformed ({type(exc).__name__})")
    try:
        st = os.lstat(trace)
    except OSError as exc:
        return LoadedSummary(STALE, why=f"trace gone ({exc.strerror or exc})")
    try:
        owner = os.lstat(path).st_uid
    except OSError as exc:
        return LoadedSummary(STALE, why=f"summary gone ({exc.strerror or exc})")
    if owner != st.st_uid:  # planted in a shared directory: it could say anything
        return LoadedSummary(STALE, why=f"summary owned by user {owner}, its trace by {st.st_uid}")
    if st.st_size != size:
        return LoadedSummary(STALE, why=f"trace is {st.st_size} bytes, summary says {size}")
    if st.st_mtime_ns == mtime_ns:
        return LoadedSummary(MATCH, record)
    try:
        now = tie_of(trace)
    except OSError as exc:
        return LoadedSummary(STALE, why=f"trace modified and unreadable ({exc.strerror or exc})")
    if now["blake2b"] != tie.get("blake2b"):
        return LoadedSummary(STALE, why="trace content changed since its summary was written")
    return LoadedSummary(MATCH, record)
