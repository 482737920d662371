"""Every name profcallbacks puts on disk, and the parsers that read them back.

Writers (the session, the exporter, the CAPTURE-file trigger) and readers (``profcallbacks
report``) share this one module, so the two cannot drift apart::

    <logdir>/
      step000120-schedule/                      capture_dir_name(120, "schedule")
        rank0_myhost.120.pt.trace.json.gz       trace_file_name("rank0_myhost", 120)
        rank0_myhost.120.pt.trace_json.gz.summary  summary_file_name(...): its summary
        all-ranks.120.trace.json.gz             merged_file_name(120): every rank, aligned
      step000300-manual-partial/                capture_dir_name(300, "manual", partial=True)
      profcallbacks/                            META_DIR
        rank0.steps.jsonl                       steps_file(logdir, 0)
        rank0.findings.jsonl                    findings_file(logdir, 0)
        rank0.memory.step000120.pickle          memory_snapshot_file(logdir, 0, 120) (CUDA)
        retention.jsonl                         retention_log_file(logdir): captures removed
      .profcallbacks-staging/                   STAGING_DIR: exports in progress
      CAPTURE                                   CAPTURE_FILE: drop it to ask for a capture

Example:
    >>> capture_dir_name(120, "schedule")
    'step000120-schedule'
    >>> parse_capture_dir("step000300-manual-partial")
    (300, 'manual', True)
    >>> trace_file_name("rank0_myhost", 120)
    'rank0_myhost.120.pt.trace.json.gz'
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

META_DIR = "profcallbacks"
"""Per-rank steps and findings files live in ``<logdir>/profcallbacks/``."""
STAGING_DIR = ".profcallbacks-staging"
"""Captures being exported; a name the TensorBoard plugin ignores."""
CAPTURE_FILE = "CAPTURE"
"""A file of this name in the log directory asks a running job for a capture."""

RUN_LOCK = "run.lock"
"""``<logdir>/profcallbacks/run.lock``: host and pid of the run writing into the log directory."""

CAPTURE_DIR = re.compile(r"^step(\d+)-([A-Za-z]+)(-partial)?(?:-(\d+))?$")
"""``step000120-schedule``; ``-2``, ``-3`` ... follow when an earlier run took the name."""
TRACE_FILE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")
"""The TensorBoard plugin's own pattern: worker, optional span number, optional gzip."""
MERGED_FILE = re.compile(r"^all-ranks\.(\d+)\.trace\.json\.gz$")
"""The merged trace of all ranks: no ``.pt.trace.json``, so the plugin never takes it for a worker."""
SUMMARY_SUFFIX = ".summary"
"""What ends a trace's summary file (:func:`summary_file_name`)."""
RANK_FILE = re.compile(r"^rank(\d+)\.(findings|steps)\.jsonl$")


def capture_dir_name(first_step: int, trigger: str, *, partial: bool = False) -> str:
    """``step000120-schedule``: the first captured step and what triggered the capture."""
    return f"step{first_step:06d}-{trigger}" + ("-partial" if partial else "")


def numbered_capture_dir(name: str, number: int) -> str:
    """``name`` for the first run to publish it, ``name-2``, ``name-3`` ... for later runs."""
    return name if number <= 1 else f"{name}-{number}"


def run_lock_file(logdir: Path) -> Path:
    """The run marker of the one live run in ``logdir``."""
    return logdir / META_DIR / RUN_LOCK


def parse_capture_dir(name: str) -> tuple[int, str, bool] | None:
    """``(first_step, trigger, partial)`` of a capture directory name, else ``None``."""
    match = CAPTURE_DIR.match(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(2).lower(), bool(match.group(3))


def trace_file_name(worker: str, first_step: int) -> str:
    """``<worker>.<first step>.pt.trace.json.gz``: the plugin's worker and span, equal on all ranks."""
    return f"{worker}.{first_step}.pt.trace.json.gz"


def summary_file_name(trace_name: str) -> str:
    """The summary written next to the trace ``trace_name``, named so that nothing that reads
    traces takes it for one: HTA reads every ``.json`` and ``.gz`` file of a directory,
    TensorBoard's plugin every ``*.pt.trace.json[.gz]``, and users glob ``*.pt.trace.json*``.

    Example:
        >>> summary_file_name("rank0_myhost.120.pt.trace.json.gz"), summary_file_name("t.json")
        ('rank0_myhost.120.pt.trace_json.gz.summary', 't.json.summary')
    """
    return trace_name.replace(".pt.trace.json", ".pt.trace_json") + SUMMARY_SUFFIX


def merged_file_name(first_step: int) -> str:
    """``all-ranks.<first step>.trace.json.gz``: one capture's ranks in one trace."""
    return f"all-ranks.{first_step}.trace.json.gz"


def retention_log_file(logdir: Path) -> Path:
    """One JSON line per capture removed to keep the log directory within its byte budget."""
    return logdir / META_DIR / "retention.jsonl"


def steps_file(logdir: Path, rank: int) -> Path:
    """Step-time summaries of one rank, one JSON object per line."""
    return logdir / META_DIR / f"rank{rank}.steps.jsonl"


def findings_file(logdir: Path, rank: int) -> Path:
    """Findings of one rank, one JSON object per line."""
    return logdir / META_DIR / f"rank{rank}.findings.jsonl"


def new_run_id() -> str:
    """The id written as ``"run"`` in every steps-file row and finding of this run.

    The launcher's own id where there is one, equal on all ranks (torchrun's
    ``TORCHELASTIC_RUN_ID``, Slurm's ``SLURM_JOB_ID`` with its step); else the start time, pid
    and a random tag.
    A run restarted into the same log directory gets another id, so the report keeps its rows
    apart from the earlier run's.

    Example:
        >>> isinstance(new_run_id(), str)
        True
    """
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic != "none":
        return f"torchrun-{elastic}"
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        return f"slurm-{job}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{os.urandom(2).hex()}"


def run_specific_file(path: Path, run: str) -> Path:
    """``rank0.steps.<run>.jsonl``: where a run that lost the log directory's run marker writes
    its own lines, never into the file the run now holding the marker writes (readers of
    ``rank<N>.steps.jsonl`` never see it)."""
    stem, _, suffix = path.name.rpartition(".")
    return path.with_name(f"{stem}.{run}.{suffix}")


def parse_rank_file(name: str) -> tuple[int, str] | None:
    """``(rank, "steps" | "findings")`` of a per-rank file name, else ``None``."""
    match = RANK_FILE.match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def memory_snapshot_file(logdir: Path, rank: int, first_step: int) -> Path:
    """CUDA memory snapshot of the memory capture starting at ``first_step`` (``_memory_viz``)."""
    return logdir / META_DIR / f"rank{rank}.memory.step{first_step:06d}.pickle"
