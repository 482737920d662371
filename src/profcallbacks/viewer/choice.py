"""Which trace file ``profcallbacks open`` serves: a file given, or one capture of a run.

Example:
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> for name in ("step000003-schedule", "step000020-schedule"):
    ...     (run / name).mkdir()
    ...     _ = (run / name / f"rank0_host_1.{name[4:10].lstrip('0')}.pt.trace.json.gz").write_bytes(b"")
    >>> choose_trace(run).relative_to(run).as_posix()
    'step000020-schedule/rank0_host_1.20.pt.trace.json.gz'
"""

from __future__ import annotations

import re
from pathlib import Path

from profcallbacks.report.read.logdir import Capture, RunFiles, find_runs, foreign_run

_RANK = re.compile(r"^rank(\d{1,9})_")


class ChoiceError(Exception):
    """The path, capture or rank asked for does not name one trace; ``str()`` says what does."""


def choose_trace(path: Path, *, capture: str | None = None, rank: int | None = None,
                 merged: bool = False) -> Path:
    """The trace file to open.

    Args:
        path: A trace file, a run's log directory, or a directory of foreign traces.
        capture: A capture directory's name (``step000120-schedule``); default the latest.
        rank: Open this rank's file of the capture.
        merged: Open the capture's merged trace of all ranks. Without ``rank`` and ``merged`` the
            merged trace is opened where the capture has several ranks and one, else its first file.

    Raises:
        ChoiceError: Nothing to open there, several runs, or no such capture, rank or merged trace.
    """
    if path.is_file():
        if capture is not None or rank is not None or merged:
            raise ChoiceError(f"{path} is one trace file: --capture, --rank and --merged choose "
                              "within a log directory")
        return path
    chosen = _capture(_run(path), capture)
    if merged:
        if chosen.merged is None:
            raise ChoiceError(f"{chosen.directory.name} has no merged trace (one is written for "
                              "captures of several ranks); open one rank with --rank N")
        return chosen.merged
    if rank is not None:
        for file in chosen.files:
            if _rank_of(file) == rank:
                return file
        ranks = sorted({r for f in chosen.files if (r := _rank_of(f)) is not None})
        raise ChoiceError(f"{chosen.directory.name} has no trace of rank {rank}; its ranks: "
                          f"{', '.join(map(str, ranks)) or 'none named'}")
    if chosen.merged is not None and len(chosen.files) > 1:
        return chosen.merged
    if not chosen.files:
        raise ChoiceError(f"{chosen.directory.name} holds no trace file yet (still being written?)")
    return min(chosen.files, key=lambda f: (_rank_of(f) is None, _rank_of(f) or 0, f.name))


def _run(path: Path) -> RunFiles:
    if not path.is_dir():
        raise ChoiceError(f"{path}: no such file or directory")
    try:
        runs = find_runs(path)
    except OSError as exc:
        raise ChoiceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if len(runs) > 1:
        names = ", ".join(str(r.root) for r in runs[:4]) + (" ..." if len(runs) > 4 else "")
        raise ChoiceError(f"{path} holds {len(runs)} runs ({names}); open one of them")
    run = runs[0] if runs and runs[0].captures else foreign_run(path)
    if run is None or not run.captures:
        raise ChoiceError(f"{path}: no capture and no torch.profiler trace here yet")
    return run


def _capture(run: RunFiles, name: str | None) -> Capture:
    if name is None:
        return run.captures[-1]  # sorted by first step: the latest
    for item in run.captures:
        if item.directory.name == name:
            return item
    names = ", ".join(c.directory.name for c in run.captures[-6:])
    raise ChoiceError(f"no capture {name!r} in {run.root}; the latest: {names}")


def _rank_of(file: Path) -> int | None:
    match = _RANK.match(file.name)
    return int(match.group(1)) if match else None
