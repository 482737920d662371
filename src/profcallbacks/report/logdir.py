"""Finds what a profcallbacks log directory holds: capture directories, steps and findings files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from profcallbacks.layout import CAPTURE_DIR, META_DIR, TRACE_FILE, parse_capture_dir, parse_rank_file

_MAX_DEPTH = 4


@dataclass
class Capture:
    """One capture directory: ``step000120-schedule/`` with one trace file per rank."""

    directory: Path
    first_step: int
    trigger: str
    partial: bool
    files: list[Path] = field(default_factory=list)


@dataclass
class RunFiles:
    """The files of one run (one log directory)."""

    root: Path
    captures: list[Capture] = field(default_factory=list)
    steps_files: dict[int, Path] = field(default_factory=dict)
    findings_files: dict[int, Path] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.captures or self.steps_files or self.findings_files)


def scan_run(root: Path) -> RunFiles:
    """The capture directories and per-rank files directly under ``root``."""
    run = RunFiles(root=root)
    for child in sorted(root.iterdir()):
        parsed = parse_capture_dir(child.name)
        if parsed and child.is_dir():
            files = sorted(p for p in child.iterdir() if TRACE_FILE.match(p.name) and p.is_file())
            run.captures.append(Capture(child, *parsed, files))
    meta = root / META_DIR
    if meta.is_dir():
        for path in sorted(meta.iterdir()):
            rank_file = parse_rank_file(path.name)
            if rank_file:
                rank, what = rank_file
                target = run.findings_files if what == "findings" else run.steps_files
                target[rank] = path
    run.captures.sort(key=lambda c: (c.first_step, c.directory.name))
    return run


def find_runs(path: Path) -> list[RunFiles]:
    """Every run at or below ``path`` (up to four levels down), shallowest first.

    A run is a directory holding a ``profcallbacks/`` directory or capture directories. Hidden
    directories and the capture directories themselves are not searched.
    """
    runs: list[RunFiles] = []
    base_depth = len(path.parts)
    for dirpath, dirnames, _ in os.walk(path):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not CAPTURE_DIR.match(d)
                             and d != META_DIR)
        run = scan_run(here)
        if not run.empty:
            runs.append(run)
            dirnames[:] = []  # a run's subdirectories are its own (e.g. TensorBoard plugins)
        elif len(here.parts) - base_depth >= _MAX_DEPTH:
            dirnames[:] = []
    return runs
