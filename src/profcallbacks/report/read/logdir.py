"""Finds what a profcallbacks log directory holds: capture directories, steps and findings files."""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from profcallbacks.layout import (
    CAPTURE_DIR,
    MERGED_FILE,
    META_DIR,
    TRACE_FILE,
    parse_capture_dir,
    parse_rank_file,
)

_MAX_DEPTH = 4


@dataclass
class Capture:
    """One capture directory: ``step000120-schedule/`` with one trace file per rank.

    Foreign traces (not written by profcallbacks) form one capture per directory that holds them,
    with ``first_step`` and ``trigger`` ``None``.
    """

    directory: Path
    first_step: int | None
    trigger: str | None
    partial: bool
    files: list[Path] = field(default_factory=list)
    merged: Path | None = None
    """The merged trace of all ranks (``all-ranks.<step>.trace.json.gz``): not one of ``files``."""


@dataclass
class RunFiles:
    """The files of one run (one log directory)."""

    root: Path
    captures: list[Capture] = field(default_factory=list)
    steps_files: dict[int, Path] = field(default_factory=dict)
    findings_files: dict[int, Path] = field(default_factory=dict)
    problems: list[dict[str, str]] = field(default_factory=list)
    """Directories that could not be listed: ``{"file": path, "error": why}``."""

    @property
    def empty(self) -> bool:
        return not (self.captures or self.steps_files or self.findings_files)


def scan_run(root: Path) -> RunFiles:
    """The capture directories and per-rank files directly under ``root``.

    A directory that cannot be listed is a problem of the run (``run.problems``), never an error.
    """
    run = RunFiles(root=root)
    for name in _listdir(root, run):
        child = root / name
        parsed = parse_capture_dir(name)
        if parsed and child.is_dir() and _inside(child, root, run):
            files = sorted(child / f for f in _listdir(child, run)
                           if TRACE_FILE.match(f) and (child / f).is_file()
                           and _inside(child / f, root, run))
            merged = next((child / f for f in _listdir(child, run) if MERGED_FILE.match(f)), None)
            run.captures.append(Capture(child, *parsed, files, merged))
    meta = root / META_DIR
    if meta.is_dir() and _inside(meta, root, run):
        for name in _listdir(meta, run):
            rank_file = parse_rank_file(name)
            if rank_file and _inside(meta / name, root, run):
                rank, what = rank_file
                target = run.findings_files if what == "findings" else run.steps_files
                target[rank] = meta / name
    run.captures.sort(key=lambda c: (c.first_step, c.directory.name))
    return run


def _inside(path: Path, root: Path, run: RunFiles) -> bool:
    """``path`` is no link leading out of ``root``; one that does is a problem of the run and
    is not read (in a shared log directory another user may have planted it)."""
    if not path.is_symlink():
        return True
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) == base:
        return True
    run.problems.append({"file": str(path), "error": f"a link out of the log directory (to "
                                                     f"{real}); not read"})
    return False


def _listdir(path: Path, run: RunFiles) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        run.problems.append({"file": str(path), "error": f"cannot list it ({exc.strerror or exc})"})
        return []


def find_runs(path: Path) -> list[RunFiles]:
    """Every run at or below ``path`` (up to four levels down), shallowest first.

    Raises:
        OSError: No run was found and a directory could not be listed (e.g. ``path`` itself).

    A run is a directory holding a ``profcallbacks/`` directory or capture directories. Hidden
    directories and the capture directories themselves are not searched.
    """
    runs: list[RunFiles] = []
    base_depth = len(path.parts)
    errors: list[OSError] = []
    for dirpath, dirnames, _ in os.walk(path, onerror=errors.append):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not CAPTURE_DIR.match(d)
                             and d != META_DIR)
        run = scan_run(here)
        if not run.empty or (run.problems and (here / META_DIR).is_dir()):
            runs.append(run)
            dirnames[:] = []  # a run's subdirectories are its own (e.g. TensorBoard plugins)
        elif len(here.parts) - base_depth >= _MAX_DEPTH:
            dirnames[:] = []
    if not runs and errors:
        raise errors[0]
    return runs


_FOREIGN_NAME = (".json", ".json.gz")
_PEEK_BYTES = 1 << 16


def is_chrome_trace(path: Path) -> bool:
    """Whether ``path`` looks like a Chrome trace: a (gzipped) JSON file that has ``traceEvents``.

    Only its first 64 KiB are read; the full parse happens (with named errors) in the report.
    """
    if not path.name.endswith(_FOREIGN_NAME) or MERGED_FILE.match(path.name) or not path.is_file():
        return False
    try:
        with open(path, "rb") as raw:
            head = gzip.GzipFile(fileobj=raw).read(_PEEK_BYTES) if path.suffix == ".gz" \
                else raw.read(_PEEK_BYTES)
    except (OSError, EOFError, zlib.error):
        return path.suffix == ".gz" and TRACE_FILE.match(path.name) is not None
    return b'"traceEvents"' in head


def foreign_run(path: Path) -> RunFiles | None:
    """A run of foreign torch.profiler traces at ``path`` (a trace file or a directory).

    Each directory (up to four levels down) holding trace files is one capture; ``None`` when
    there are none.
    """
    if path.is_file():
        if not is_chrome_trace(path):
            return None
        return RunFiles(root=path.parent, captures=[Capture(path.parent, None, None, False, [path])])
    run = RunFiles(root=path)
    base_depth = len(path.parts)
    for dirpath, dirnames, filenames in os.walk(path):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if len(here.parts) - base_depth >= _MAX_DEPTH:
            dirnames[:] = []
        files = sorted(here / f for f in filenames if is_chrome_trace(here / f))
        if files:
            run.captures.append(Capture(here, None, None, False, files))
    return run if run.captures else None
