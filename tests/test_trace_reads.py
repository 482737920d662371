"""Traces parsed ahead in worker processes give the report that file-by-file reading gives: eight
real DLRM ranks (one with its summary, one replaced by a file that is no trace), read with two
worker processes and with none; and the choice of workers on fixed sizes and cores."""

from __future__ import annotations

import gzip
import json
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from profcallbacks.layout import summary_file_name
from profcallbacks.report import build_report, locate_run
from profcallbacks.report.read import stream
from profcallbacks.report.read.files import ReadError
from profcallbacks.report.read.summaries import SummaryUse
from profcallbacks.report.summarize import read_one, summarize_one
from profcallbacks.report.trace_reads import MAX_WORKERS, PARALLEL_MIN_BYTES, TraceReads, workers_for

DLRM = Path(__file__).parent / "data" / "dlrm-ranks"


def _run(tmp_path: Path) -> Path:
    """A foreign run of the eight ranks; rank 2 summarised, rank 5's file not a trace."""
    run = tmp_path / "run"
    run.mkdir()
    for trace in sorted(DLRM.glob("*.pt.trace.json.gz")):
        if trace.name.startswith("worker5_"):
            (run / trace.name).write_bytes(b"not gzip at all")
        else:
            shutil.copy2(trace, run / trace.name)
    summarised = next(run.glob("worker2_*"))
    assert summarize_one(summarised)[0] == "written"
    return run


def _report(run: Path, processes: int) -> str:
    done = subprocess.run([sys.executable, "-m", "profcallbacks.cli", "report", "--format",
                           "json", "--processes", str(processes), str(run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_workers_give_the_report_that_reading_file_by_file_gives(tmp_path: Path) -> None:
    run = _run(tmp_path)
    alone, ahead = _report(run, 1), _report(run, 2)
    assert ahead == alone
    report = json.loads(ahead)
    assert report["summaries"] == {"read": 1, "parsed": 7, "missing": 7, "stale": []}
    assert [p["file"] for p in report["problems"]] == [str(next(run.glob("worker5_*")))]
    assert len(report["captures"][0]["files"]) == 8
    assert report["captures"][0]["job"]["ranks"] == 7


def test_the_workers_parse_the_traces(tmp_path: Path) -> None:
    """The files are parsed in the workers (their process ids), in the order asked."""
    run = _run(tmp_path)
    paths = sorted(run.glob("*.pt.trace.json.gz"))
    use = SummaryUse()
    with TraceReads(paths, processes=2) as reads:
        assert reads.workers == 2
        for path in paths:
            try:
                summary, row = reads.next(path, use)
            except ReadError as exc:
                assert path.name.startswith("worker5_") and "gzip" in exc.reason
                continue
            assert row["source"] == ("summary" if path.name.startswith("worker2_") else "trace")
            assert summary.path == path
        pids = {f.result() for f in [reads.pool.submit(os.getpid) for _ in range(4)]}
    assert os.getpid() not in pids and len(pids) <= 2
    assert (use.read, use.parsed, use.missing) == (1, 7, 7)
    with TraceReads(paths, processes=2) as reads:
        with pytest.raises(ValueError, match="out of order"):
            reads.next(paths[1], use)


def test_a_worker_killed_leaves_the_rest_read_here(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A worker killed (as for memory) mid-run: the files not yet read are read in this process,
    each counted once, with a warning; so are they all where the workers cannot start."""
    run = _run(tmp_path)
    paths = sorted(run.glob("*.pt.trace.json.gz"))
    use = SummaryUse()
    read: list[Path | None] = []

    def take(reads: TraceReads, path: Path) -> None:
        try:
            read.append(reads.next(path, use)[0].path)
        except ReadError:
            read.append(None)

    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        with TraceReads(paths, processes=2) as reads:
            take(reads, paths[0])
            assert reads.pool is not None
            for pid in list(reads.pool._processes):
                os.kill(pid, signal.SIGKILL)
            for path in paths[1:]:
                take(reads, path)
            assert reads.pool is None and reads.workers == 0
    assert read == [p if not p.name.startswith("worker5_") else None for p in paths]
    assert (use.read, use.parsed, use.missing) == (1, 7, 7)
    assert "reading the traces one at a time" in caplog.text


def test_workers_that_cannot_start_leave_the_reading_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(method: str) -> None:
        raise ValueError(f"cannot find context for {method!r}")

    monkeypatch.setattr(multiprocessing, "get_context", refuse)
    paths = sorted(_run(tmp_path).glob("*.pt.trace.json.gz"))
    use = SummaryUse()
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        with TraceReads(paths[:2], processes=2) as reads:
            assert reads.pool is None
            assert reads.next(paths[0], use)[0].path == paths[0]
    assert "cannot find context" in caplog.text and use.parsed == 1


def test_workers_only_where_they_pay(tmp_path: Path) -> None:
    big = [tmp_path / f"rank{r}.pt.trace.json" for r in range(12)]
    for path in big:
        with open(path, "wb") as f:
            f.truncate(PARALLEL_MIN_BYTES // 4)
    assert workers_for(big, summaries=True, cores=4) == 4
    assert workers_for(big, summaries=True, cores=64) == MAX_WORKERS
    assert workers_for(big, summaries=True, cores=1) == 0
    assert workers_for(big[:3], summaries=True, cores=4) == 0  # under PARALLEL_MIN_BYTES
    for path in big[:10]:  # summarised: only two left to parse
        path.with_name(summary_file_name(path.name)).write_text("{}")
    assert workers_for(big, summaries=True, cores=4) == 0
    assert workers_for(big, summaries=False, cores=4) == 4
    assert TraceReads(big, processes=1).workers == 0
    assert TraceReads(big[:3], processes=8).workers == 3


def test_gzipped_traces_count_as_gunzipped(tmp_path: Path) -> None:
    """Two gzipped traces of 16 MiB gunzipped, a few KiB on disk, are worth two workers."""
    packed = []
    for rank in range(2):
        path = tmp_path / f"rank{rank}.pt.trace.json.gz"
        path.write_bytes(gzip.compress(b" " * (PARALLEL_MIN_BYTES // 2)))
        packed.append(path)
    assert sum(p.stat().st_size for p in packed) < PARALLEL_MIN_BYTES // 100
    assert workers_for(packed, summaries=True, cores=2) == 2


def test_a_worker_parse_takes_its_share_of_the_memory(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two parses at once each take half of the reader's share of the memory available."""
    monkeypatch.setattr(stream, "available_bytes", lambda: 400 * stream.BYTES_PER_EVENT)
    trace = next(DLRM.glob("worker0_*"))
    with pytest.raises(ReadError) as whole:
        read_one(trace, SummaryUse(), summaries=False)
    assert "more than 200 events" in whole.value.reason and "50% of the" in whole.value.reason
    with pytest.raises(ReadError) as half:
        read_one(trace, SummaryUse(), summaries=False, readers=2)
    assert "more than 100 events" in half.value.reason and "25% of the" in half.value.reason


def test_the_report_refuses_no_processes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "profcallbacks.cli", "report", "--processes",
                           "0", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--processes must be at least 1, got 0" in done.stderr


def test_build_report_reads_in_workers_alike(tmp_path: Path) -> None:
    run = _run(tmp_path)
    alone = build_report(locate_run(run))  # the default: file by file
    ahead = build_report(locate_run(run), processes=3)
    assert json.dumps(ahead, sort_keys=True, default=str) == json.dumps(alone, sort_keys=True,
                                                                        default=str)
