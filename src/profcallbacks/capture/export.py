"""Writes capture windows to disk, each capture directory appearing whole.

The training process keeps only what must happen there: kineto's raw save of a stopped profiler
(:class:`TraceExporter`, in ``export_helper``). Parsing, post-processing, gzip and publishing run
in :class:`CaptureWriter`, inside a helper process, where they cannot take the GIL from training;
they are kept short (collector paused, orjson, fast gzip: ~0.5 s of CPU for a 60 MB trace
instead of ~4.5 s) because the helper still shares the machine's cores and memory bandwidth.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profcallbacks.capture.byte_budget import ByteBudget
from profcallbacks.capture.postprocess import CaptureInfo, postprocess
from profcallbacks.core.faults import describe_error
from profcallbacks.findings import Finding
from profcallbacks.layout import (
    STAGING_DIR,
    numbered_capture_dir,
    parse_capture_dir,
    trace_file_name,
)
from profcallbacks.report.reading import gc_paused

log = logging.getLogger(__name__)

_READY = ".ready"

CaptureHook = Callable[[Path, CaptureInfo, list[Any]], list[Finding]]
"""Called after a capture is published with its trace file, its info and the run's history: a
list the hook keeps for itself (``report.live.capture_findings`` appends a profile of each
capture, so a slowdown capture is compared with an earlier healthy one)."""


GZIP_LEVEL = 1
"""Traces are gzipped fast: level 1 takes 0.13 s for a 60 MB trace where level 6 takes 0.32 s,
for a file ~20% larger."""

try:  # optional (profcallbacks[report]): parses a trace 1.5x, writes it 8x faster than json
    import orjson

    _ORJSON: Any = orjson
except ImportError:  # pragma: no cover - exercised where orjson is absent
    _ORJSON = None


def _decode(data: bytes) -> Any:
    """The raw trace, parsed; the standard library where orjson refuses it (NaN, Infinity)."""
    if _ORJSON is not None:
        try:
            return _ORJSON.loads(data)
        except _ORJSON.JSONDecodeError:
            pass
    return json.loads(data)


def _encode(trace: Any) -> bytes:
    """The trace as compact JSON; the standard library where orjson refuses it (an integer
    beyond 64 bits, a non-string key)."""
    if _ORJSON is not None:
        try:
            return bytes(_ORJSON.dumps(trace))
        except _ORJSON.JSONEncodeError:
            pass
    return json.dumps(trace, separators=(",", ":")).encode()


def _collector_paused() -> contextlib.AbstractContextManager[None]:
    """The cyclic collector paused while a trace is parsed and rewritten (millions of objects,
    no cycles: 3 s become 0.6 s for a 60 MB trace), in the helper process only: on the thread
    fallback it would pause the training process's collector."""
    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return gc_paused()


def raw_trace_path(logdir: Path, info: CaptureInfo) -> Path:
    """Where the training process saves the raw (kineto) trace of ``info`` for the writer."""
    return logdir / STAGING_DIR / info.name / f".{info.rank.worker}.raw.json"


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
            a capture directory with what is there.
        on_published: Called with each published trace file (e.g. live verdicts); its findings
            travel back to the training thread.
        budget: The byte budget: the process that publishes a capture merges its ranks' traces
            and keeps the log directory within its bytes (``published.AfterPublish``).
    """

    def __init__(self, logdir: Path, *, tracing_ranks: int = 1, publish_timeout_s: float = 30.0,
                 on_published: CaptureHook | None = None, budget: ByteBudget | None = None) -> None:
        self._logdir = logdir
        self._staging = logdir / STAGING_DIR
        self._tracing_ranks = tracing_ranks
        self.publish_timeout_s = publish_timeout_s
        self.on_published = on_published
        self._waiting: set[str] = set()
        self._history: list[Any] = []  # the hook's own record of earlier captures
        self._written: dict[str, tuple[str, CaptureInfo]] = {}
        self.exported: list[Path] = []
        self.findings: list[Finding] = []
        self.failures = 0
        self._after_publish: Any = None
        if budget is not None:
            from profcallbacks.capture.published import AfterPublish  # merge: helper side only

            self._after_publish = AfterPublish(logdir, budget)

    def export(self, raw: Path, info: CaptureInfo) -> None:
        """Write one raw trace; a fault only warns (training never hears of it)."""
        try:
            self._export(raw, info)
        except Exception as exc:
            self.failures += 1
            log.warning("profcallbacks: could not export capture %s (%s); training "
                        "continues and later captures are still tried.",
                        info.name, describe_error(exc, self._staging))
            self._discard(info)

    def close(self) -> None:
        """Publish captures still waiting for other ranks (after a bounded wait)."""
        deadline = time.monotonic() + self.publish_timeout_s
        while self._waiting and time.monotonic() < deadline:
            for name in list(self._waiting):
                self._publish(name, force=False)
            if self._waiting:
                time.sleep(0.2)
        for name in list(self._waiting):
            self._publish(name, force=True)
        with contextlib.suppress(OSError):  # only when empty: another rank may still stage
            self._staging.rmdir()

    def _export(self, raw: Path, info: CaptureInfo) -> None:
        stage = self._staging / info.name
        with _collector_paused():
            encoded = _encode(postprocess(_decode(raw.read_bytes()), info))
        name = trace_file_name(info.rank.worker, info.first_step)
        writing = stage / f".{name}.writing"
        try:
            with gzip.open(writing, "wb", compresslevel=GZIP_LEVEL) as f:
                f.write(encoded)
            del encoded
            os.replace(writing, stage / (name + _READY))
        finally:
            writing.unlink(missing_ok=True)
        raw.unlink(missing_ok=True)  # only now: until here a killed writer leaves it to rescue
        self._written[info.name] = (name, info)
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
        ready = sorted(stage.glob("*" + _READY)) if stage.is_dir() else []
        if not stage.is_dir():  # another rank published it (maybe as name-2: a restarted run)
            written = self._written.get(name)
            file = written[0] if written else ""
            self._published(name, published_dir(self._logdir, name, file))
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
                                [p.name[: -len(_READY)] for p in ready])
        if force and len(ready) < self._tracing_ranks:
            log.warning("profcallbacks: capture %s published with %d of %d ranks' traces.",
                        name, len(ready), self._tracing_ranks)

    def _published(self, name: str, final: Path) -> None:
        self._waiting.discard(name)
        self.exported.append(final)
        written = self._written.pop(name, None)
        if written is None or self.on_published is None:
            return
        trace, info = final / written[0], written[1]
        try:
            self.findings.extend(self.on_published(trace, info, self._history))
        except Exception as exc:  # the analysis never costs the capture
            log.warning("profcallbacks: analysing capture %s failed (%s: %s).", name,
                        type(exc).__name__, exc)

    def _discard(self, info: CaptureInfo) -> None:
        stage = self._staging / info.name
        with contextlib.suppress(OSError):  # e.g. a read-only file system: reported at next start
            for path in stage.glob(f".{info.rank.worker}*"):
                path.unlink(missing_ok=True)
        self._waiting.discard(info.name)


def rescue_raw(logdir: Path, info: CaptureInfo) -> Path | None:
    """Publish the raw trace of ``info`` as it is, in a ``-partial`` directory (writer gone)."""
    raw = raw_trace_path(logdir, info)
    if not raw.is_file():
        return None
    name = info.name if info.name.endswith("-partial") else info.name + "-partial"
    file = trace_file_name(info.rank.worker, info.first_step).removesuffix(".gz")
    final = free_capture_dir(logdir, name, [file])
    final.mkdir(parents=True, exist_ok=True)
    os.replace(raw, final / file)
    with contextlib.suppress(OSError):
        for path in raw.parent.glob(f".{info.rank.worker}*"):
            path.unlink(missing_ok=True)
        raw.parent.rmdir()
    return final


def load_hook() -> CaptureHook | None:
    """The live capture analysis, where installed (``profcallbacks.report.live``)."""
    try:
        from profcallbacks.report import live
    except ImportError:
        return None
    hook: Any = getattr(live, "capture_findings", None)
    return hook


def publish_stage(logdir: Path, name: str) -> Path | None:
    """Publish the staged capture ``name`` with its complete (``.ready``) files; never overwrites.

    Takes the stage's ``.publishing`` lock (a directory: atomic, also on NFS), renames the ready
    files to their final names and moves the stage to ``logdir/<name>`` in one rename, or, when
    another rank of the run published that directory first, moves the files in one by one.
    Returns the capture directory, or ``None`` when another rank holds the lock.

    Raises:
        OSError: The file system refused (full, read-only); the stage stays for a later try.
    """
    stage = logdir / STAGING_DIR / name
    ready = sorted(stage.glob("*" + _READY))
    try:
        (stage / ".publishing").mkdir()
    except (FileExistsError, FileNotFoundError):
        return None  # another rank is publishing (or just has)
    try:
        for path in ready:
            os.replace(path, stage / path.name[: -len(_READY)])
    except OSError:  # e.g. read-only now: leave no lock behind, a later try starts over
        with contextlib.suppress(OSError):
            (stage / ".publishing").rmdir()
        raise
    files = [path.name[: -len(_READY)] for path in ready]
    final = free_capture_dir(logdir, name, files)
    try:
        if final.exists():
            raise FileExistsError(final)
        os.replace(stage, final)  # the lock moves along: no other rank can take it meanwhile
    except OSError:  # published earlier (another rank of this run): move our files in
        if not final.is_dir():
            raise
        for file in files:
            os.replace(stage / file, final / file)
        _remove_tree(stage)
    else:
        (final / ".publishing").rmdir()
    return final


def published_dir(logdir: Path, name: str, file: str) -> Path:
    """The directory of capture ``name`` that holds ``file`` (``name``, ``name-2`` ...)."""
    number = 1
    while True:
        final = logdir / numbered_capture_dir(name, number)
        if not final.exists() or (file and (final / file).exists()):
            return final if final.exists() or number == 1 else logdir / name
        number += 1


def free_capture_dir(logdir: Path, name: str, files: list[str]) -> Path:
    """Where to publish ``files`` of capture ``name``: never over a file an earlier run published.

    ``logdir/name`` unless it holds one of ``files`` already (a restarted run that took the same
    capture again); then ``name-2``, ``name-3`` ... The ranks of one run pick the same directory.
    """
    number = 1
    while True:
        final = logdir / numbered_capture_dir(name, number)
        if not final.exists() or not any((final / file).exists() for file in files):
            return final
        number += 1


def recover_staging(logdir: Path, *, older_than: float) -> list[str]:
    """Finish publishes a killed run left in staging; returns one line per thing done.

    Staged trace files that were complete (``.ready``) are published (never over an earlier
    capture); half-written ones (``.writing``, ``.raw.json``) are removed; a leftover
    ``.publishing`` lock is removed, also from a published capture directory. Only entries
    modified before ``older_than`` (seconds since the epoch, the file server's clock) are
    touched: they belong to no live run. Never raises.
    """
    done: list[str] = []
    staging = logdir / STAGING_DIR
    for published in _listdir(logdir):
        lock = logdir / published / ".publishing"
        if lock.is_dir() and _safe(lambda lock=lock: lock.rmdir()):
            done.append(f"removed a leftover publish lock from {published}")
    for name in _listdir(staging):
        stage = staging / name
        try:
            if not stage.is_dir() or stage.stat().st_mtime >= older_than:
                continue
            with contextlib.suppress(OSError):
                (stage / ".publishing").rmdir()
            broken = [p for p in stage.iterdir() if p.name.endswith((".writing", ".raw.json"))]
            for path in broken:
                path.unlink()
            if broken:
                done.append(f"removed {len(broken)} half-written trace file(s) of capture {name}")
            final = publish_stage(logdir, name) if any(stage.glob("*" + _READY)) else None
            if final is not None:
                done.append(f"published stranded capture {name} as {final.name}")
            else:
                _remove_tree(stage)
        except OSError as exc:
            done.append(f"could not recover capture {name} ({describe_error(exc, stage)}); it "
                        f"stays in {staging}")
    with contextlib.suppress(OSError):
        staging.rmdir()
    return done


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _safe(action: Any) -> bool:
    try:
        action()
    except OSError:
        return False
    return True


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()
