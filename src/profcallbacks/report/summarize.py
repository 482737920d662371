"""Summaries of traces: read one trace (its summary when it matches), write summaries in bulk.

``read_one`` is how the report reads each trace file: from its summary when the summary still
describes it, else by parsing the trace. ``summarize_files`` writes summaries for traces the
library did not write (``profcallbacks summarize DIR``), over a process pool; under a launcher
(torchrun, srun) each rank takes its share of the files by index and ``gather_counts`` sums the
ranks' counts on rank 0 over the process group.

Example:
    >>> from pathlib import Path
    >>> done = summarize_files([], processes=1)
    >>> done.written, done.failed
    (0, [])
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profcallbacks.capture.summary_file import load_summary, tie_of, write_summary
from profcallbacks.core.collector import gc_paused
from profcallbacks.core.ranks import launcher_ranks
from profcallbacks.report.analyse.captures import analyse_trace
from profcallbacks.report.analyse.rank_summary import collective_calls, host_of, summary_record
from profcallbacks.report.analyse.ranks import call_waits, parts
from profcallbacks.report.analyse.trace_fold import step_rows
from profcallbacks.report.rank_meeting import collect, post
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.summaries import SummaryUse, read_summary
from profcallbacks.report.read.traces import TraceSummary, read_trace_file

log = logging.getLogger(__name__)


def rank_row(record: dict[str, Any], source: str, path: Path) -> dict[str, Any]:
    """What the job view (``report/analyse/ranks.py``) reads of one rank's file, in numbers
    only (a job of thousands of ranks keeps one such row per rank): its parts of the step and
    its collectives' waits."""
    analysis = record.get("analysis") or {}
    metrics = analysis.get("metrics")
    return {"source": source, "rank": record.get("rank"), "host": record.get("host"),
            "parts": parts(metrics) if metrics else None,
            "collectives": call_waits(record.get("collectives") or []), "path": path}


def pooled_part(analysis: dict[str, Any], rank: int) -> dict[str, Any]:
    """What the capture's pooled verdict and its rank verdicts read of one file's analysis
    (``captures.capture_analysis``, ``rank_verdicts``): not its per-step rows."""
    return {**{k: analysis[k] for k in ("metrics", "diagnoses", "throughput") if k in analysis},
            "rank": rank}


def detail_rows(rows: list[dict[str, Any]], ranks: set[Any] | None, *,
                summaries: bool = True) -> list[tuple[int, list[dict[str, Any]], Any]]:
    """``(entry, per-step rows, host per-step rows)`` of the ``rows`` of ``ranks`` (all when
    ``None``), read again: a large capture keeps them only for the ranks that stand out."""
    out = []
    for row in rows:
        if ranks is not None and row["rank"] not in ranks:
            continue
        try:
            summary, _ = read_one(row["path"], SummaryUse(), summaries=summaries)
        except ReadError:  # gone since: its rows are left out
            continue
        out.append((row["entry"], step_rows(summary),
                    (summary.analysis or {}).get("host", {}).get("per_step", [])))
    return out


def read_one(path: Path, use: SummaryUse, *, summaries: bool = True,
             readers: int = 1) -> tuple[TraceSummary, dict[str, Any]]:
    """``path``'s ``TraceSummary`` (with its analysis) and its job-view row (``source``:
    ``"summary"`` or ``"trace"``), counted in ``use``; with ``summaries``, from its summary when
    that still matches the trace. ``readers``: traces parsed at once, sharing the memory a parse
    may take (``read/stream.py``: ``event_limit``).

    Raises:
        ReadError: The trace had to be parsed and cannot be read.
    """
    if summaries:
        found = read_summary(path, use)
        if found is not None:
            return found[0], rank_row(found[1], "summary", path)
    use.parsed += 1
    model = read_trace_file(path, readers)
    summary = model.summary
    summary.analysis = analyse_trace(model)
    row = rank_row({"rank": summary.rank, "host": host_of(summary.worker),
                    "worker": summary.worker, "analysis": summary.analysis,
                    "collectives": collective_calls(model.scan, summary.steps)}, "trace", path)
    del model
    return summary, row


def summarize_one(path: Path, force: bool = False) -> tuple[str, str]:
    """Write the summary of the trace ``path`` (unless one matches it, or ``force``);
    ``(status, path)`` with status ``written``, ``kept`` or the error. Never raises."""
    try:
        if not force and load_summary(path).status == "match":
            return "kept", str(path)
        tie = tie_of(path)  # before the parse: a trace that changes meanwhile reads as stale
        with gc_paused():
            model = read_trace_file(path)
            record = summary_record(model, analyse_trace(model))
            del model
        write_summary(path.parent, path.name, record, tie)
        return "written", str(path)
    except ReadError as exc:
        return f"not a readable trace ({exc.reason})", str(path)
    except Exception as exc:  # one bad file never stops the others
        return f"{type(exc).__name__}: {exc}", str(path)


@dataclass
class SummarizeResult:
    """What ``summarize_files`` did: summaries written, kept (still matching), files that failed."""

    written: int = 0
    kept: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, why)

    def add(self, status: str, path: str) -> None:
        if status == "written":
            self.written += 1
        elif status == "kept":
            self.kept += 1
        else:
            self.failed.append((path, status))


def share(files: list[Path], rank: int, world_size: int) -> list[Path]:
    """The files rank ``rank`` of ``world_size`` summarises: every ``world_size``-th by index."""
    return files[rank::world_size]


def summarize_files(files: list[Path], *, processes: int = 1,
                    force: bool = False) -> SummarizeResult:
    """Write the summaries of ``files`` with ``processes`` worker processes (1: in this one)."""
    result = SummarizeResult()
    if processes <= 1 or len(files) <= 1:
        for path in files:
            result.add(*summarize_one(path, force))
        return result
    with ProcessPoolExecutor(max_workers=min(processes, len(files))) as pool:
        for status, name in pool.map(summarize_one, files, [force] * len(files),
                                     chunksize=max(1, len(files) // (processes * 8))):
            result.add(status, name)
    return result


def launcher_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of a torchrun or srun step (``core/ranks.launcher_ranks``: an sbatch
    script run once is one rank); ``(0, 1)`` outside a job."""
    return launcher_ranks(os.environ) or (0, 1)


def gather_counts(result: SummarizeResult, rank: int, world_size: int,
                  directory: Path) -> SummarizeResult:
    """Sum every rank's ``result`` on rank 0; outside a job, ``result`` itself. Ranks meet in
    a process group already made, or one joined at torchrun's ``MASTER_ADDR`` (gloo) and left
    afterwards; an srun step's ranks through files in ``directory`` (``rank_meeting.py``)."""
    if world_size <= 1:
        return result
    mine = (result.written, result.kept, result.failed)
    dist = sys.modules.get("torch.distributed")
    joined = bool(dist is not None and getattr(dist, "is_initialized", bool)())
    gathered: list[Any] | None
    if joined or (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        gathered = _gather_in_group(mine, rank, world_size, own=not joined)
    else:
        post(directory, rank, mine)
        gathered = list(collect(directory, world_size).values()) if rank == 0 else None
    if gathered is None:
        return result
    total = SummarizeResult()
    for written, kept, failed in gathered:
        total.written += written
        total.kept += kept
        total.failed += [tuple(f) for f in failed]
    return total


def _gather_in_group(mine: Any, rank: int, world_size: int, *, own: bool) -> list[Any] | None:
    """Every rank's ``mine`` on the group's rank 0 (``None`` on the others); ``own``: the group
    is joined at ``env://`` (gloo) first and left afterwards."""
    import torch.distributed as dist

    if own:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    try:
        first = dist.get_rank() == 0
        gathered: list[Any] = [None] * dist.get_world_size() if first else []
        dist.gather_object(mine, gathered if first else None, dst=0)
    finally:
        if own:
            dist.destroy_process_group()
    return gathered if first else None
