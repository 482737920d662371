"""The report from summaries holds running totals and a row of numbers per rank, not every rank's
summary: its peak memory barely grows with the rank count (simulated jobs of 96 and 384 ranks made
from a real gloo rank's trace, as tests/test_summaries_job.py makes them)."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import many_ranks  # noqa: E402

from profcallbacks.report import build_report, locate_run  # noqa: E402
from profcallbacks.report.summarize import summarize_files  # noqa: E402

SMALL, LARGE = 96, 384
PER_RANK_KIB = 4.0
"""What each further rank may add to the report's peak: its own rows in the report (file entry,
rank verdict: ~1.3 KiB) and its row of numbers for the job view (~0.9 KiB). Holding each rank's
summary until the end, as the report once did, cost ~36 KiB per rank."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[int, Path]:
    out = {}
    for ranks in (SMALL, LARGE):
        logdir = tmp_path_factory.mktemp(f"job{ranks}") / "logs"
        files = many_ranks.simulate_job(logdir, ranks)
        done = summarize_files(files, processes=2)
        assert done.written == ranks and not done.failed
        out[ranks] = logdir
    return out


def peak_mib(logdir: Path) -> tuple[float, dict]:
    run = locate_run(logdir)
    tracemalloc.start()
    try:
        report = build_report(run)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return peak, report


def test_peak_memory_of_the_report_from_summaries_is_flat_in_the_rank_count(jobs):
    small, report_small = peak_mib(jobs[SMALL])
    large, report_large = peak_mib(jobs[LARGE])
    for report, ranks in ((report_small, SMALL), (report_large, LARGE)):
        assert report["summaries"]["read"] == ranks and report["summaries"]["parsed"] == 0
        job = report["captures"][0]["job"]
        assert [s["rank"] for s in job["stragglers"]] == [19, 21]
    per_rank_kib = (large - small) * 1024 / (LARGE - SMALL)
    assert per_rank_kib < PER_RANK_KIB, (small, large)
