"""A simulated job of 64 ranks made from a real gloo rank's trace (benchmarks/many_ranks.py): two
slow ranks on one host; `summarize` with 2 processes, then `report` names them and their host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import many_ranks  # noqa: E402

from profcallbacks.report import build_report, locate_run  # noqa: E402
from profcallbacks.report.render.text import render_text  # noqa: E402

RANKS = 64


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profcallbacks.cli", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("job") / "logs"
    many_ranks.simulate_job(logdir, RANKS)
    done = cli("summarize", str(logdir), "--processes", "2")
    assert done.returncode == 0, done.stderr
    assert f"{RANKS} summaries written" in done.stdout
    return logdir


def test_the_report_names_the_two_slow_ranks_and_their_host(job):
    done = cli("report", str(job), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summaries"]["read"] == RANKS and report["summaries"]["parsed"] == 0
    view = report["captures"][0]["job"]
    assert [(s["rank"], s["host"]) for s in view["stragglers"]] == [(19, "node-02"), (21, "node-02")]
    assert view["straggler_hosts"] == [{"host": "node-02", "ranks": [19, 21]}]
    for s in view["stragglers"]:  # the others wait about SLOW_MS per collective, 4 per step
        assert 3.0 < s["others_wait_ms"] < 4 * (many_ranks.SLOW_MS + many_ranks.JITTER_MS)
    dist = view["distributions"]
    assert dist["comm_ms"]["median"] > dist["comm_ms"]["p99"] - 2 * many_ranks.JITTER_MS * 4
    assert dist["comm_ms"]["worst_rank"] not in (19, 21)
    assert view["clusters"][0]["count"] == RANKS
    text = render_text(report)
    assert "stragglers (the others wait for them): ranks 19, 21 on node-02" in text
    assert "straggler rank 19 on node-02" in text
    assert len([line for line in text.splitlines() if "straggler rank" in line]) == 2


def test_the_same_stragglers_from_the_traces(job):
    report = build_report(locate_run(job), summaries=False)
    assert report["summaries"]["parsed"] == RANKS
    view = report["captures"][0]["job"]
    assert [(s["rank"], s["host"]) for s in view["stragglers"]] == [(19, "node-02"), (21, "node-02")]


def test_a_job_without_slow_ranks_has_no_straggler(tmp_path):
    many_ranks.simulate_job(tmp_path / "logs", 16, slow=())
    view = build_report(locate_run(tmp_path / "logs"))["captures"][0]["job"]
    assert view["stragglers"] == [] and "straggler" not in view["sentence"]
    assert view["ranks"] == 16


def test_a_large_capture_merges_its_slowest_ranks_and_a_median_one(tmp_path):
    from profcallbacks.capture.merge import merge_capture
    from profcallbacks.capture.merge_choice import MERGE_ALL_UP_TO, SLOWEST, merge_choice
    from profcallbacks.report.summarize import summarize_files

    files = many_ranks.simulate_job(tmp_path / "logs", 24, slow=(19, 21))
    assert len(files) > MERGE_ALL_UP_TO
    assert merge_choice(files) == files  # no summaries yet: nothing to rank them by
    summarize_files(files, processes=1)
    chosen = merge_choice(files)
    ranks = [int(p.name.split("_")[0][4:]) for p in chosen]
    assert len(chosen) == SLOWEST + 1 and {19, 21} <= set(ranks)
    meta = merge_capture(chosen, tmp_path / "all-ranks.4.trace.json.gz", budget_bytes=None)
    assert sorted(r["rank"] for r in meta["ranks"]) == sorted(ranks)
    assert merge_choice(files[:MERGE_ALL_UP_TO]) == files[:MERGE_ALL_UP_TO]
