"""Writes capture windows to disk off the training thread, each capture directory appearing whole."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profcallbacks.capture.postprocess import CaptureInfo, postprocess
from profcallbacks.core.faults import describe_error
from profcallbacks.layout import STAGING_DIR, numbered_capture_dir, trace_file_name

log = logging.getLogger(__name__)

_READY = ".ready"


@dataclass
class _Job:
    profiler: Any  # a stopped torch.profiler.profile
    info: CaptureInfo


class TraceExporter:
    """Post-processes and gzips each stopped capture on a background thread.

    Files are staged under ``<logdir>/.profcallbacks-staging/<capture>/`` with names the
    TensorBoard plugin ignores. Once every tracing rank's file is there, one rank renames the
    staged directory to ``<logdir>/<capture>/``, so the plugin (which loads each run directory
    once) never sees a capture with a file missing or half written.

    Args:
        logdir: Root log directory.
        tracing_ranks: How many ranks write a file into each capture directory.
        publish_timeout_s: At close, how long to wait for other ranks' files before publishing
            a capture directory with what is there.
    """

    def __init__(self, logdir: Path, *, tracing_ranks: int = 1, publish_timeout_s: float = 30.0):
        self._logdir = logdir
        self._staging = logdir / STAGING_DIR
        self._tracing_ranks = tracing_ranks
        self._publish_timeout_s = publish_timeout_s
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._waiting: set[str] = set()
        self._thread: threading.Thread | None = None
        self.exported: list[Path] = []
        self.analyse = True
        """Analyse each exported capture (report/live.py); its findings go to ``findings``."""
        self.findings: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._history: list[dict[str, Any]] = []

    def submit(self, profiler: Any, info: CaptureInfo) -> None:
        """Queue a stopped profiler for export; returns at once."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="profcallbacks-export",
                                            daemon=True)
            self._thread.start()
        self._queue.put(_Job(profiler, info))

    def close(self, timeout_s: float = 120.0) -> None:
        """Finish queued exports, then publish captures still waiting for other ranks."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("profcallbacks: trace export still running after %.0f s; "
                            "unfinished captures stay in %s.", timeout_s, self._staging)
            self._thread = None
        deadline = time.monotonic() + self._publish_timeout_s
        while self._waiting and time.monotonic() < deadline:
            for name in list(self._waiting):
                self._publish(name, force=False)
            if self._waiting:
                time.sleep(0.2)
        for name in list(self._waiting):
            self._publish(name, force=True)
        with contextlib.suppress(OSError):  # only when empty: another rank may still stage
            self._staging.rmdir()

    @property
    def busy(self) -> bool:
        """An export is queued or running (it competes with training for the GIL)."""
        return self._queue.unfinished_tasks > 0

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                self._export(job)
            except Exception as exc:  # export faults never reach the training thread
                log.warning("profcallbacks: could not export capture %s (%s); training "
                            "continues and later captures are still tried.",
                            job.info.name, describe_error(exc, self._staging))
                self._discard(job.info)
            finally:
                self._queue.task_done()

    def _export(self, job: _Job) -> None:
        info = job.info
        stage = self._staging / info.name
        stage.mkdir(parents=True, exist_ok=True)
        raw = stage / f".{info.rank.worker}.raw.json"
        try:
            job.profiler.export_chrome_trace(str(raw))
            with open(raw, encoding="utf-8") as f:
                trace = json.load(f)
        finally:
            raw.unlink(missing_ok=True)
        job.profiler = None  # free the profiler's buffers before writing
        trace = postprocess(trace, info)
        writing = stage / f".{trace_file_name(info.rank.worker, info.first_step)}.writing"
        with gzip.open(writing, "wt", encoding="utf-8", compresslevel=6) as f:
            json.dump(trace, f, separators=(",", ":"))
        os.replace(writing, stage / (trace_file_name(info.rank.worker, info.first_step) + _READY))
        self._waiting.add(info.name)
        self._publish(info.name, force=False)
        if self.analyse:
            self._analyse(trace, info)

    def _analyse(self, trace: dict[str, Any], info: CaptureInfo) -> None:
        """Live verdict of the capture; a failure only warns and turns the analysis off."""
        try:
            from profcallbacks.report.live import capture_findings

            for finding in capture_findings(trace, info, self._history):
                self.findings.put(finding)
        except Exception as exc:
            self.analyse = False
            log.warning("profcallbacks: live analysis of capture %s failed (%s: %s); it is off "
                        "for the rest of the run.", info.name, type(exc).__name__, exc)

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
        if not stage.is_dir():  # another rank published it
            self._waiting.discard(name)
            self.exported.append(self._logdir / name)
            return
        if len(ready) < self._tracing_ranks and not force:
            return
        final = publish_stage(self._logdir, name)
        if final is None:
            return  # another rank is publishing (or just has)
        self.exported.append(final)
        self._waiting.discard(name)
        if force and len(ready) < self._tracing_ranks:
            log.warning("profcallbacks: capture %s published with %d of %d ranks' traces.",
                        name, len(ready), self._tracing_ranks)

    def _discard(self, info: CaptureInfo) -> None:
        stage = self._staging / info.name
        with contextlib.suppress(OSError):  # e.g. a read-only file system: reported at next start
            for path in stage.glob(f".{info.rank.worker}*"):
                path.unlink(missing_ok=True)
        self._waiting.discard(info.name)


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
    for path in ready:
        os.replace(path, stage / path.name[: -len(_READY)])
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
