"""Writes capture windows to disk, each capture directory appearing whole.

The training process keeps only what must happen there: kineto's raw save of a stopped profiler
(``TraceExporter``, in ``capture/exporter.py``). Parsing, post-processing, gzip and publishing run
in :class:`CaptureWriter`, inside a helper process, where they cannot take the GIL from training;
they are kept short (collector paused, orjson, fast gzip: ~0.5 s of CPU for a 60 MB trace
instead of ~4.5 s) because the helper still shares the machine's cores and memory bandwidth.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from profcallbacks.capture.claims import (
    CLAIM_PREFIX,
    RAW_TOKEN,
    StagingClaim,
    live_claims,
    owed_elsewhere,
)
from profcallbacks.capture.findings_track import append_events, capture_track
from profcallbacks.capture.pieces import stitch
from profcallbacks.capture.postprocess import postprocess
from profcallbacks.capture.summary_file import SUMMARY_KEY, trace_tie, write_summary
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.collector import gc_paused
from profcallbacks.core.faults import describe_error
from profcallbacks.core.json_codec import dumps_compact
from profcallbacks.core.json_codec import loads as loads_json
from profcallbacks.core.safefs import (
    UnsafeEntryError,
    create_exclusive,
    ensure_dir,
    fresh_name,
    is_own,
    make_private_dir,
    open_dir,
    read_regular,
    remove_own,
    remove_own_tree,
)
from profcallbacks.findings import Finding
from profcallbacks.layout import (
    CAPTURE_DIR,
    STAGING_DIR,
    TRACE_FILE,
    numbered_capture_dir,
    parse_capture_dir,
    summary_file_name,
    trace_file_name,
)

log = logging.getLogger(__name__)

_READY = ".ready"

CaptureHook = Callable[[bytes, CaptureInfo, list[Any]], list[Finding]]
"""Called before a capture is written with its trace (JSON), its info and the run's history: a
list the hook keeps for itself (the session's live analysis appends a profile of each capture,
so a slowdown capture is compared with an earlier healthy one)."""


def in_directory(finding: Finding, name: str, final: Path) -> Finding:
    """``finding`` about capture ``name`` (``details["capture"]``) as published in ``final``
    (``name-2`` where an earlier run took the name): the directory named in its details."""
    if finding.details.get("capture") != name:
        return finding
    message = finding.message
    if final.name != name:
        message = message.replace(f"capture {name}:", f"capture {final.name}:", 1)
    return replace(finding, message=message, details={
        **finding.details, "capture": final.name, "directory": str(final.absolute())})


GZIP_LEVEL = 1
"""Traces are gzipped fast: level 1 takes 0.13 s for a 60 MB trace where level 6 takes 0.32 s,
for a file ~20% larger."""

def _collector_paused() -> contextlib.AbstractContextManager[None]:
    """The cyclic collector paused while a trace is parsed and rewritten (millions of objects,
    no cycles: 3 s become 0.6 s for a 60 MB trace), in the helper process only: on the thread
    fallback it would pause the training process's collector."""
    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return gc_paused()


RAW_DIR_PREFIX = ".raw-"
"""Staging holds one private directory (``mkdtemp``, mode 0700) per raw trace kineto saves."""
RAW_FILE = "trace.json"
MAX_RAW_BYTES = 1 << 40
_STAGED_FILE = re.compile(
    r"^.*(\.pt\.trace\.json(\.gz)?(\.ready)?|\.pt\.trace_json(\.gz)?\.summary|\.writing|\.raw\.json)$")
"""Files a capture's stage may hold: trace files (``.ready`` once complete), their summaries and
half-written ones."""


def new_raw_trace_path(logdir: Path, info: CaptureInfo, claim: StagingClaim | None = None) -> Path:
    """A fresh path for kineto's raw save of ``info``: in a private directory of an unpredictable
    name under staging, since kineto writes by path (it would follow a planted link); with
    ``claim``, one that names it (no other rank's recovery removes it).

    Raises:
        UnsafeEntryError: The staging directory is a link or another user's.
    """
    staging = logdir / STAGING_DIR
    ensure_dir(staging, own=True)
    prefix = RAW_DIR_PREFIX
    if claim is not None:
        claim.hold()
        prefix = claim.raw_prefix
    private = make_private_dir(staging, f"{prefix}{info.name}-{info.rank.worker}-")
    return private / RAW_FILE


def remove_raw(raw: Path) -> bool:
    """Remove a raw trace and its private directory with whatever else kineto left in it (its
    ``trace.json.tmp`` when a save failed half-way), only what is ours; never raises. False
    when something of it stays (a read-only file system)."""
    try:
        return remove_own_tree(raw.parent, inside=raw.parent.parent) or _lstat(raw.parent) is None
    except OSError:
        return False


def remove_raws(raw: Path, info: CaptureInfo) -> list[Path]:
    """Remove the raw trace of ``info`` and those of its earlier pieces; never raises. Returns
    those that stay."""
    return [path for path in [*map(Path, info.pieces), raw] if not remove_raw(path)]


class CaptureWriter:
    """Post-processes and gzips each raw trace, then publishes its capture directory.

    Files are staged under ``<logdir>/.profcallbacks-staging/<capture>/`` with names the
    TensorBoard plugin ignores. Once every tracing rank's file is there, one rank renames the
    staged directory to ``<logdir>/<capture>/``, so the plugin (which loads each run directory
    once) never sees a capture with a file missing or half written.

    Args:
        logdir: Root log directory.
        tracing_ranks: How many ranks write a file into each capture directory.
        publish_timeout_s: At close, how long to wait for other ranks' files before publishing
            a capture directory with what is there (and saying it is partial), while no live
            rank owes it a file (a rank that never started, or was killed).
        owed_timeout_s: The same while another live rank still owes the capture a file
            (``claims.owed_elsewhere``: its window is open, or its file is being written): a
            guard against a rank that hangs, not a time a slow rank is expected to need.
        on_published: Called with each trace (its JSON) before it is written (the live
            verdict); the verdict and diagnoses among its findings go into the trace's findings
            track, and its findings travel back to the training thread once it is published.
        after_publish: Called in the process that published a capture, with its directory,
            trigger and the file names it put there (``published.AfterPublish``: the merged
            trace of all ranks and the log directory's byte budget).
    """

    def __init__(self, logdir: Path, *, tracing_ranks: int = 1, publish_timeout_s: float = 30.0,
                 owed_timeout_s: float = 120.0, on_published: CaptureHook | None = None,
                 after_publish: Callable[[Path, str, list[str]], None] | None = None) -> None:
        self._logdir = logdir
        self._staging = logdir / STAGING_DIR
        self._tracing_ranks = tracing_ranks
        self.publish_timeout_s = publish_timeout_s
        self.owed_timeout_s = owed_timeout_s
        self.on_published = on_published
        self._waiting: set[str] = set()
        self._history: list[Any] = []  # the hook's own record of earlier captures
        self._written: dict[str, tuple[str, CaptureInfo, list[Finding]]] = {}
        self.exported: list[Path] = []
        self.findings: list[Finding] = []
        self.failures = 0
        self._after_publish = after_publish
        self._left: list[Path] = []  # raw traces a failed write could not remove (read-only)
        self._half: list[tuple[str, str]] = []  # (stage, file) a failed write left half written
        self._claim = StagingClaim(logdir)  # the stages it writes into are a live rank's
        self.own_claims: tuple[str, ...] = ()
        """Claims of this rank (its training process's, ...): what they owe is not waited for."""

    def export(self, raw: Path, info: CaptureInfo) -> None:
        """Write one raw trace; a fault only warns (training never hears of it)."""
        try:
            self._export(raw, info)
        except Exception as exc:
            self.failures += 1
            log.warning("profcallbacks: could not export capture %s (%s); training "
                        "continues and later captures are still tried.",
                        info.name, describe_error(exc, self._staging))
            self._discard(raw, info)

    def close(self) -> None:
        """Publish captures still waiting for other ranks (after a bounded wait)."""
        start = time.monotonic()
        mine = (self._claim.token, *self.own_claims)
        while self._waiting:
            for name in list(self._waiting):
                self._publish(name, force=False)
            owed = any(owed_elsewhere(self._staging, name, mine=mine) for name in self._waiting)
            if not self._waiting or time.monotonic() - start >= (
                    self.owed_timeout_s if owed else self.publish_timeout_s):
                break
            time.sleep(0.2)
        for name in list(self._waiting):
            self._publish(name, force=True)
        self._remove_left()
        self._claim.release()
        with contextlib.suppress(OSError):  # only when empty: another rank may still stage
            self._staging.rmdir()

    def _remove_left(self) -> None:
        """Remove what failed writes left (the file system was read-only then and is no longer);
        what still cannot go is named, and removed at the next start."""
        self._left = [raw for raw in self._left if not remove_raw(raw)]
        half = []
        for stage, file in self._half:
            try:
                with _stage_dir(self._logdir, stage, create=False) as stage_fd:
                    if not _unlinked(file, stage_fd):
                        half.append((stage, file))
                        continue
                with contextlib.suppress(OSError):  # only when empty: another rank may stage
                    os.rmdir(self._staging / stage)
            except OSError:  # gone with its stage (published, or never made)
                pass
        self._half = half
        if self._left or self._half:
            log.warning("profcallbacks: %d unfinished trace file(s) stay in %s (the file system "
                        "still refuses); the next run in this log directory removes them.",
                        len(self._left) + len(self._half), self._staging)

    def _export(self, raw: Path, info: CaptureInfo) -> None:
        with _collector_paused():  # raw traces are read only as regular files of ours
            trace = postprocess(stitch([loads_json(read_regular(path, max_bytes=MAX_RAW_BYTES))
                                        for path in [*map(Path, info.pieces), raw]]), info)
            base_ns = int(trace.get("baseTimeNanoseconds", 0))
            trace["traceEvents"] = trace.pop("traceEvents")  # last: the track goes after them
            encoded = dumps_compact(trace)
            del trace
            found = self._analyse(encoded, info)
            encoded = append_events(encoded, capture_track(info, base_ns, found))
        name = trace_file_name(info.rank.worker, info.first_step)
        self._claim.add(info.name)  # before the stage exists: never a stage nobody claims
        with _stage_dir(self._logdir, info.name, create=True) as stage_fd:
            writing = fresh_name(f".{name}.") + ".writing"  # created exclusively, no link followed
            self._half.append((info.name, writing))  # until it is gone
            try:
                with os.fdopen(create_exclusive(writing, dir_fd=stage_fd), "wb") as out, \
                        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=GZIP_LEVEL) as f:
                    f.write(encoded)
                del encoded
                self._write_summary(stage_fd, writing, name, info)  # before: it moves along
                os.replace(writing, name + _READY, src_dir_fd=stage_fd, dst_dir_fd=stage_fd)
            finally:
                if _unlinked(writing, stage_fd):  # else read-only: removed at close
                    self._half.remove((info.name, writing))
        self._left += remove_raws(raw, info)  # only now: until here a killed writer rescues it
        self._written[info.name] = (name, info, found)
        self._waiting.add(info.name)
        self._publish(info.name, force=False)

    def _publish(self, name: str, *, force: bool) -> None:
        """Publish ``name`` if it is complete (or ``force``); a file-system error only warns."""
        try:
            self._try_publish(name, force=force)
        except OSError as exc:
            log.warning("profcallbacks: could not publish capture %s yet (%s); it stays in %s.",
                        name, describe_error(exc, self._staging), self._staging)
            if force:
                self._waiting.discard(name)

    def _try_publish(self, name: str, *, force: bool) -> None:
        stage = self._staging / name
        ready = _ready_files(stage)
        if not is_own(stage, kind="dir"):  # another rank published it (maybe as name-2)
            written = self._written.get(name)
            file = written[0] if written else ""
            published = published_dir(self._logdir, name, file)
            if file and _lstat(published / file) is None:  # written into the stage it moved?
                published = published_dir(self._logdir, name, file + _READY)
                finish_late_files(published)
            self._published(name, published)
            if force or (written is not None and written[1].partial):  # joined a partial one
                self._say_partial(published)
            return
        if len(ready) < self._tracing_ranks and not force:
            return
        final = publish_stage(self._logdir, name)
        if final is None:
            return  # another rank is publishing (or just has)
        self._published(name, final)
        if self._after_publish is not None:
            parsed = parse_capture_dir(final.name)
            self._after_publish(final, parsed[1] if parsed else "",
                                [p[: -len(_READY)] for p in ready])
        if force:
            self._say_partial(final)

    def _say_partial(self, final: Path) -> None:
        """Warn when the capture ``final`` holds fewer than every tracing rank's trace (those
        of all ranks so far: a later rank's file that joins it says so again)."""
        present = sorted(f for f in _listdir(final) if TRACE_FILE.match(f))
        if len(present) < self._tracing_ranks:
            log.warning("profcallbacks: capture %s published with %d of %d ranks' traces (%s).",
                        final.name, len(present), self._tracing_ranks, ", ".join(present))

    def _analyse(self, encoded: bytes, info: CaptureInfo) -> list[Finding]:
        """The live analysis of a capture's trace (its JSON) before it is written: its verdict
        and diagnoses go into the trace's findings track; never raises."""
        if self.on_published is None:
            return []
        try:
            return self.on_published(encoded, info, self._history)
        except Exception as exc:  # the analysis never costs the capture
            log.warning("profcallbacks: analysing capture %s failed (%s: %s).", info.name,
                        type(exc).__name__, exc)
            return []

    def _write_summary(self, stage_fd: int, writing: str, name: str, info: CaptureInfo) -> None:
        """Write the live analysis's summary of the trace just written (``writing``, to be
        ``name``) into the stage, tied to the trace's bytes; a failure only warns."""
        last = self._history[-1] if self._history else None
        if not isinstance(last, dict) or last.get("name") != info.name:
            return
        record = last.pop(SUMMARY_KEY, None)
        if not isinstance(record, dict):
            return
        try:
            fd = os.open(writing, os.O_RDONLY, dir_fd=stage_fd)
            try:
                tie = trace_tie(fd)
            finally:
                os.close(fd)
            write_summary(stage_fd, name, record, tie)
        except Exception as exc:  # the trace is still published; reports read it instead
            log.warning("profcallbacks: could not write the summary of capture %s (%s).",
                        info.name, describe_error(exc, self._staging))

    def _published(self, name: str, final: Path) -> None:
        self._waiting.discard(name)
        with contextlib.suppress(OSError):
            self._claim.drop(name)
        self.exported.append(final)
        written = self._written.pop(name, None)
        if written is not None:
            self.findings.extend(in_directory(found, written[1].name, final)
                                 for found in written[2])

    def _discard(self, raw: Path, info: CaptureInfo) -> None:
        self._left += remove_raws(raw, info)  # e.g. read-only: tried again at close
        self._waiting.discard(info.name)
        with contextlib.suppress(OSError):
            self._claim.drop(info.name)


def rescue_raw(logdir: Path, info: CaptureInfo, raw: Path) -> Path | None:
    """Publish the raw trace of ``info`` as it is, in a ``-partial`` directory (writer gone).

    A capture saved in pieces keeps only its last (all but its first step): joining them is the
    writer's work."""
    for piece in map(Path, info.pieces):
        remove_raw(piece)
    if not is_own(raw, kind="file"):
        return None
    name = info.name if info.name.endswith("-partial") else info.name + "-partial"
    file = trace_file_name(info.rank.worker, info.first_step).removesuffix(".gz")
    final = free_capture_dir(logdir, name, [file])
    ensure_dir(final, own=True)
    with _directory(final) as final_fd:
        os.replace(raw, file, dst_dir_fd=final_fd)
    remove_raw(raw)
    return final


def publish_stage(logdir: Path, name: str) -> Path | None:
    """Publish the staged capture ``name`` with its complete (``.ready``) files; never overwrites.

    Takes the stage's ``.publishing`` lock (a directory: atomic, also on NFS), renames the ready
    files to their final names and moves the stage to ``logdir/<name>`` in one rename, or, when
    another rank of the run published that directory first, moves the files in one by one.
    Returns the capture directory, or ``None`` when another rank holds the lock. Every step is
    relative to directories opened without following links: nothing leaves the log directory.

    Raises:
        OSError: The file system refused (full, read-only); the stage stays for a later try.
    """
    try:
        stage_fd = _open_stage(logdir, name, create=False)
    except (FileNotFoundError, UnsafeEntryError):
        return None  # published meanwhile, or not ours
    try:
        return _publish_from(logdir, name, stage_fd)
    finally:
        os.close(stage_fd)


def _publish_from(logdir: Path, name: str, stage_fd: int) -> Path | None:
    ready = sorted(e for e in os.listdir(stage_fd)
                   if e.endswith(_READY) and is_own(e, kind="file", dir_fd=stage_fd))
    try:
        os.mkdir(".publishing", dir_fd=stage_fd)
    except (FileExistsError, FileNotFoundError):
        return None  # another rank is publishing (or just has)
    try:
        for entry in ready:
            os.replace(entry, entry[: -len(_READY)], src_dir_fd=stage_fd, dst_dir_fd=stage_fd)
    except OSError:  # e.g. read-only now: leave no lock behind, a later try starts over
        with contextlib.suppress(OSError):
            os.rmdir(".publishing", dir_fd=stage_fd)
        raise
    files = [entry[: -len(_READY)] for entry in ready]
    final = free_capture_dir(logdir, name, files)
    with _directory(logdir, follow=True) as logdir_fd, \
            _directory(logdir / STAGING_DIR) as staging_fd:
        try:
            if _lstat(final) is not None:
                raise FileExistsError(final)
            os.replace(name, final.name, src_dir_fd=staging_fd, dst_dir_fd=logdir_fd)
        except OSError:  # published earlier (another rank of this run): move our files in
            if not is_own(final, kind="dir"):
                raise
            with _directory(final) as final_fd:
                for file in files:
                    os.replace(file, file, src_dir_fd=stage_fd, dst_dir_fd=final_fd)
                    with contextlib.suppress(FileNotFoundError):  # its summary, when written
                        os.replace(summary_file_name(file), summary_file_name(file),
                                   src_dir_fd=stage_fd, dst_dir_fd=final_fd)
            with contextlib.suppress(OSError):
                os.rmdir(".publishing", dir_fd=stage_fd)
            remove_own_tree(logdir / STAGING_DIR / name, inside=logdir / STAGING_DIR,
                            name=_STAGED_FILE)
        else:  # the lock moved along: no other rank could take it meanwhile
            os.rmdir(".publishing", dir_fd=stage_fd)
            finish_late_files(final)
    return final


def finish_late_files(final: Path) -> None:
    """Give their final names to complete (``.ready``) trace files of ours in the published
    directory ``final``: another rank's file that reached the stage after it was listed, or was
    still being written into it, moved along with the stage. Both the publisher (after the
    move) and that file's writer (after its rename) look, so whichever is last finds it."""
    if not is_own(final, kind="dir"):
        return
    with _directory(final) as final_fd:
        for entry in os.listdir(final_fd):
            if entry.endswith(_READY) and is_own(entry, kind="file", dir_fd=final_fd):
                with contextlib.suppress(FileNotFoundError):  # the other one was first
                    os.replace(entry, entry[: -len(_READY)], src_dir_fd=final_fd,
                               dst_dir_fd=final_fd)


def published_dir(logdir: Path, name: str, file: str) -> Path:
    """The directory of capture ``name`` that holds ``file`` (``name``, ``name-2`` ...).

    The last one that holds it: a run restarted into the same log directory writes a file of the
    same name into ``name-2``, and the earlier run's ``name`` must not be taken for it.
    """
    number, found = 1, None
    while True:
        final = logdir / numbered_capture_dir(name, number)
        if _lstat(final) is None:
            return found or logdir / name
        if file and is_own(final, kind="dir") and _lstat(final / file) is not None:
            found = final
        number += 1


def free_capture_dir(logdir: Path, name: str, files: list[str]) -> Path:
    """Where to publish ``files`` of capture ``name``: never over a file an earlier run published,
    never into anything but a directory of ours (a planted link or file is passed over).

    ``logdir/name`` unless it holds one of ``files`` already (a restarted run that took the same
    capture again); then ``name-2``, ``name-3`` ... The ranks of one run pick the same directory.
    """
    number = 1
    while True:
        final = logdir / numbered_capture_dir(name, number)
        if _lstat(final) is None or (is_own(final, kind="dir") and not any(
                _lstat(final / file) is not None for file in files)):
            return final
        number += 1


def recover_staging(logdir: Path, *, older_than: float) -> list[str]:
    """Finish publishes a killed run left in staging; returns one line per thing done.

    Staged trace files that were complete (``.ready``) are published (never over an earlier
    capture); half-written ones (``.writing``, raw saves) are removed; a leftover
    ``.publishing`` lock is removed, also from a published capture directory. Only entries
    modified before ``older_than`` (seconds since the epoch, the file server's clock) and not
    covered by a live process's claim (``claims``: another rank of this run that started first)
    are touched: they belong to no live run. Only entries provably ours are touched: directories
    and regular files of this user, never through a link, with the names this module gives them.
    Never raises.
    """
    done: list[str] = []
    staging = logdir / STAGING_DIR
    for published in _listdir(logdir):
        if CAPTURE_DIR.match(published) and is_own(logdir / published, kind="dir", inside=logdir):
            with contextlib.suppress(OSError):
                if remove_own(logdir / published / ".publishing", kind="dir"):
                    done.append(f"removed a leftover publish lock from {published}")
    if _lstat(staging) is None:
        return done
    if not is_own(staging, kind="dir", inside=logdir):
        return done + [f"{staging} is not a directory of this user (a link?); left alone"]
    live = live_claims(staging, started=older_than)
    claimed = {stage for stages in live.values() for stage in stages}
    for name in _listdir(staging):
        stage = staging / name
        raw_claim = RAW_TOKEN.match(name)
        if name.startswith(CLAIM_PREFIX) or name in claimed or (
                raw_claim is not None and raw_claim.group(1) in live):
            continue  # a live process's (another rank's): it finishes them itself
        try:
            st = _lstat(stage)
            if st is None or st.st_mtime >= older_than:
                continue
            if name.startswith(RAW_DIR_PREFIX):
                if remove_own_tree(stage, inside=staging):
                    done.append(f"removed a raw trace a killed run left half saved ({name})")
                continue
            if not CAPTURE_DIR.match(name) or not is_own(stage, kind="dir", inside=staging):
                done.append(f"left {name} in {staging} alone: not a capture directory of this "
                            "user (a link?)")
                continue
            remove_own(stage / ".publishing", kind="dir")
            broken = [e for e in _listdir(stage) if e.endswith((".writing", ".raw.json"))
                      and remove_own(stage / e, kind="file")]
            if broken:
                done.append(f"removed {len(broken)} half-written trace file(s) of capture {name}")
            final = publish_stage(logdir, name) if _ready_files(stage) else None
            if final is not None:
                done.append(f"published stranded capture {name} as {final.name}")
            elif not remove_own_tree(stage, inside=staging, name=_STAGED_FILE):
                done.append(f"left capture {name} in {staging}: it holds entries that are not "
                            "this library's")
        except OSError as exc:
            done.append(f"could not recover capture {name} ({describe_error(exc, stage)}); it "
                        f"stays in {staging}")
    with contextlib.suppress(OSError):
        staging.rmdir()
    return done


def _ready_files(stage: Path) -> list[str]:
    """The complete (``.ready``) trace files of ours in ``stage``, a directory of ours."""
    if not is_own(stage, kind="dir"):
        return []
    return sorted(e for e in _listdir(stage) if e.endswith(_READY)
                  and is_own(stage / e, kind="file"))


@contextlib.contextmanager
def _directory(path: Path, *, follow: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``path`` (never of a link to one, unless ``follow``: the
    user's own log directory may be one), closed after the block."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY) if follow else open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_stage(logdir: Path, name: str, *, create: bool) -> int:
    """A descriptor of ``<logdir>/.profcallbacks-staging/<name>``, both real directories."""
    staging = logdir / STAGING_DIR
    if create:
        ensure_dir(staging, own=True)
    with _directory(staging) as staging_fd:
        if create:
            ensure_dir(name, dir_fd=staging_fd, own=True)
        return open_dir(name, dir_fd=staging_fd)


@contextlib.contextmanager
def _stage_dir(logdir: Path, name: str, *, create: bool) -> Iterator[int]:
    fd = _open_stage(logdir, name, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def _unlinked(name: str, dir_fd: int) -> bool:
    """Remove ``name`` from the directory ``dir_fd``; False when it stays (read-only)."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
