"""The trace files of a run read in order, the next ones parsed ahead in worker processes.

A report reads each trace once, in order, folds it in and lets it go (``build.py``). Parsing a
trace is nearly all of a report's time where no summary stands in for it, and one trace does not
need another: with more than one usable core and at least ``PARALLEL_MIN_BYTES`` of traces to
parse, up to one worker process per usable core parses the next files while the report folds the
one in hand. At most ``AHEAD`` files per worker are in flight, so memory stays that of a few
traces whatever the number of ranks, and each parse takes its share of the memory the reader may
use (``read/stream.py``: ``event_limit``). The results come back in file order, so the report
is the same as one read file by file.

Example:
    >>> d = getfixture("tmp_path"); _ = (d / "rank0_a.1.pt.trace.json").write_text("{}")
    >>> use = SummaryUse()
    >>> with TraceReads([d / "rank0_a.1.pt.trace.json"]) as reads:
    ...     try:
    ...         reads.next(d / "rank0_a.1.pt.trace.json", use)
    ...     except ReadError as exc:
    ...         print(exc.reason)
    not a Chrome trace (no traceEvents array)
    >>> use.parsed
    1
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import TracebackType
from typing import Any

from profcallbacks.core.cpus import usable_cpus
from profcallbacks.layout import summary_file_name
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.summaries import SummaryUse
from profcallbacks.report.read.traces import TraceSummary
from profcallbacks.report.summarize import read_one

PARALLEL_MIN_BYTES = 16 << 20
"""Least bytes of traces to parse (files without a summary; gzipped ones by their size once
gunzipped) for worker processes to pay: a worker starts in about 0.3 s, while the reader parses
10-25 MB of trace a second here."""
AHEAD = 2
"""Files in flight per worker (one parsing, one waiting to be folded)."""
MAX_WORKERS = 8
"""Most worker processes, whatever the cores: each holds one trace's model at a time."""

Read = tuple[TraceSummary, dict[str, Any]]
log = logging.getLogger(__name__)


def workers_for(paths: list[Path], *, summaries: bool, cores: int | None = None) -> int:
    """Worker processes worth starting to parse ``paths``: 0 (read here, file by file) unless
    more than one core is usable and at least ``PARALLEL_MIN_BYTES`` of them has no summary to
    stand in (``summaries=False``: every file is parsed).

    Example:
        >>> workers_for([], summaries=True, cores=4)
        0
    """
    cores = usable_cpus() if cores is None else cores
    to_parse = [p for p in paths if not summaries or not _has_summary(p)]
    if cores < 2 or len(to_parse) < 2 or sum(map(_json_bytes, to_parse)) < PARALLEL_MIN_BYTES:
        return 0
    return min(cores, len(to_parse), MAX_WORKERS)


class TraceReads:
    """The ``read_one`` of each of ``paths``, asked for in that order with :meth:`next`.

    ``processes``: ``None`` starts the workers :func:`workers_for` finds worth it; 1 reads here,
    file by file; more starts that many (at most one per file). Used as a context manager: the
    workers stop at its end, unread files cancelled. Where the workers cannot start or one dies
    (killed for memory), the files not yet read are read here, file by file, with a warning.
    """

    def __init__(self, paths: list[Path], *, summaries: bool = True,
                 processes: int | None = None) -> None:
        self.paths = list(paths)
        self.summaries = summaries
        self.workers = (workers_for(self.paths, summaries=summaries) if processes is None
                        else 0 if processes <= 1 else min(processes, len(self.paths)))
        self.pool: ProcessPoolExecutor | None = None
        self.queued: deque[tuple[Path, Future[Any]]] = deque()
        self.submitted = 0

    def __enter__(self) -> TraceReads:
        if self.workers:
            try:
                self.pool = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("forkserver"))
            except (OSError, ValueError) as exc:
                self._alone(f"{type(exc).__name__}: {exc}")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def next(self, path: Path, use: SummaryUse) -> Read:
        """``path``'s summary and job-view row (``summarize.read_one``), counted in ``use``;
        ``path`` must be the next of the paths given.

        Raises:
            ReadError: The trace had to be parsed and cannot be read.
        """
        if self.pool is None:
            return read_one(path, use, summaries=self.summaries)
        while self.submitted < len(self.paths) and len(self.queued) < self.workers * AHEAD:
            ahead = self.paths[self.submitted]
            self.queued.append((ahead, self.pool.submit(_read, ahead, self.summaries, self.workers)))
            self.submitted += 1
        queued, future = self.queued.popleft()
        if queued != path:
            raise ValueError(f"traces read out of order: {path} asked for, {queued} next")
        try:
            read, failed, counted = future.result()
        except (BrokenProcessPool, OSError) as exc:
            self._alone(f"{type(exc).__name__}: {exc}")
            return read_one(path, use, summaries=self.summaries)
        use.add(counted)
        if failed is not None:
            raise failed
        return read


    def _alone(self, why: str) -> None:
        """Read the rest here, file by file: the workers could not start or one died."""
        log.warning("profcallbacks: reading the traces one at a time (worker processes: %s)", why)
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool, self.workers = None, 0
        self.queued.clear()


def _read(path: Path, summaries: bool,
          readers: int) -> tuple[Read | None, ReadError | None, SummaryUse]:
    """In a worker: ``read_one`` with a count of its own; a ``ReadError`` comes back with the
    count (any other exception is the report's fault and is raised as it is)."""
    use = SummaryUse()
    try:
        return read_one(path, use, summaries=summaries, readers=readers), None, use
    except ReadError as exc:
        return None, exc, use


def _has_summary(path: Path) -> bool:
    return path.with_name(summary_file_name(path.name)).exists()


def _json_bytes(path: Path) -> int:
    """``path``'s size, or for a gzipped file its size once gunzipped as its trailer records it
    (modulo 4 GiB: never less than the file itself)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if path.suffix != ".gz" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(f.read(4), "little"))
    except OSError:
        return 0
