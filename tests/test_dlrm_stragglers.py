"""Eight real DLRM ranks on V100s (tests/data/dlrm-ranks, PARAM's test data): the report names the
three ranks the others wait for in the collectives, as an expert reads them from the raw events."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from profcallbacks.report import build_report, locate_run
from profcallbacks.report.render.text import render_text
from profcallbacks.report.summarize import summarize_files

TRACES = Path(__file__).resolve().parent / "data" / "dlrm-ranks"


def arrivals() -> dict[int, list[float]]:
    """Per rank, when each of its NCCL kernels starts (us): the ranks share one clock."""
    out = {}
    for path in sorted(TRACES.glob("*.json.gz")):
        with gzip.open(path) as f:
            trace = json.load(f)
        kernels = sorted(e["ts"] for e in trace["traceEvents"]
                         if str(e.get("name", "")).startswith("ncclKernel"))
        out[trace["distributedInfo"]["rank"]] = kernels
    return out


@pytest.fixture(scope="module")
def report() -> dict:
    return build_report(locate_run(TRACES), summaries=False)


def test_the_raw_events_show_ranks_7_2_6_arrive_last():
    starts = arrivals()
    first = {r: s[0] for r, s in starts.items()}  # the step's first all-to-all, its largest wait
    order = sorted(first, key=lambda r: first[r])
    assert order[-3:] == [2, 6, 7] or order[-3:] == [6, 2, 7]
    assert min(first[r] for r in (2, 6, 7)) - first[0] > 1500  # rank 0, next latest, 1.6 ms sooner


def test_the_report_names_ranks_7_2_6_as_the_stragglers(report):
    # why: the median rank waits 5.2 ms per step in the collectives for rank 7, 3.4 for ranks 2
    # and 6, under 2 ms for any other rank
    job = report["captures"][0]["job"]
    assert [s["rank"] for s in job["stragglers"]] == [7, 2, 6]
    waits = {s["rank"]: s["others_wait_ms"] for s in job["stragglers"]}
    assert 5.0 < waits[7] < 5.3 and 3.3 < waits[2] < 3.5 and 3.3 < waits[6] < 3.5
    assert report["verdict"]["waiting_for"] == [7, 2, 6]
    text = render_text(report)
    assert "stragglers (the others wait for them): rank 7" in text
    assert "rank 0 on" not in text.split("stragglers")[1].split("\n")[0]
    assert job["distributions"]["step_ms"]["worst_rank"] == 1  # the rank that waits for them
    # ranks 0, 1 and 3 read as communication-bound: they are the ones waiting for the three
    differ = report["captures"][0]["ranks_differ"]
    assert differ.startswith("rank 0 communication_bound") and "rank 3 communication_bound" in differ
    assert differ.endswith("wait in the collectives for the straggler ranks 7, 2, 6, which arrive late")


def test_the_summaries_name_the_same_stragglers(report, tmp_path):
    copy = tmp_path / "dlrm"
    shutil.copytree(TRACES, copy)
    done = summarize_files(sorted(copy.glob("*.json.gz")), processes=1)
    assert done.written == 8 and not done.failed
    again = build_report(locate_run(copy))
    assert again["summaries"]["read"] == 8
    assert again["captures"][0]["job"]["stragglers"] == report["captures"][0]["job"]["stragglers"]
