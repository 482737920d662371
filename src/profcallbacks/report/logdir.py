"""Finds what a profcallbacks log directory holds: capture directories, steps and findings files."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

CAPTURE_DIR = re.compile(r"^step(\d+)-([A-Za-z]+)(-partial)?$")
TRACE_FILE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")
RANK_FILE = re.compile(r"^rank(\d+)\.(findings|steps)\.jsonl$")
META_DIR = "profcallbacks"
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
        match = CAPTURE_DIR.match(child.name)
        if match and child.is_dir():
            files = sorted(p for p in child.iterdir() if TRACE_FILE.match(p.name) and p.is_file())
            run.captures.append(Capture(child, int(match.group(1)), match.group(2).lower(),
                                        bool(match.group(3)), files))
    meta = root / META_DIR
    if meta.is_dir():
        for path in sorted(meta.iterdir()):
            match = RANK_FILE.match(path.name)
            if match:
                target = run.findings_files if match.group(2) == "findings" else run.steps_files
                target[int(match.group(1))] = path
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
