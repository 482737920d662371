"""A rank SIGKILLed in the middle of a capture window of a real 4-rank gloo job (torchrun): the
job ends (torchrun stops the ranks left waiting in their all-reduce with SIGTERM), the capture is
published with every surviving rank's whole trace and says which, nothing published is half
written, each surviving rank's steps file holds a row for every step it finished (the killed
rank's holds what it had written), nothing stays in staging (no claim, no raw save), the run lock
is released, and the report reads the run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import capture_dirs, torchrun, trace_files
from profcallbacks.cli import main
from profcallbacks.layout import RUN_LOCK, STAGING_DIR

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "dist_scripts" / "rank_killed_dist.py"
KILLED = 2
KILL_STEP = 7  # the script's default: the others finish this step, and fail in the next one
SURVIVORS = [rank for rank in range(4) if rank != KILLED]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    logdir = tmp_path_factory.mktemp("killed") / "logs"
    proc = torchrun(SCRIPT, 4, "--logdir", str(logdir), "--kill-rank", str(KILLED), timeout=240)
    assert proc.returncode != 0 and "Signal 9 (SIGKILL)" in proc.stderr, proc.stderr[-3000:]
    return logdir, proc.stderr


def test_the_capture_holds_the_surviving_ranks_whole_traces(killed_run: tuple[Path, str]) -> None:
    logdir, stderr = killed_run
    [capture] = capture_dirs(logdir)
    assert capture.name == "step000005-schedule-partial"
    files = trace_files(capture)
    ranks = sorted(f.name.split("_")[0] for f in files)
    assert ranks == [f"rank{rank}" for rank in SURVIVORS], ranks  # every survivor's, gzipped
    for trace in files:  # whole: gunzips and parses
        assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert not [p for p in capture.iterdir() if p.name.endswith((".writing", ".ready", ".tmp"))]
    said = [line for line in stderr.splitlines() if "ranks' traces (" in line]
    assert said and all("of 4 ranks' traces (rank" in line for line in said)
    names = {f.name for f in files}
    for line in said:  # each names the traces there when it was said, all of them in the end
        listed = line.split("ranks' traces (", 1)[1].rstrip(").").split(", ")
        assert set(listed) <= names and f"with {len(listed)} of 4" in line, (line, names)


def test_no_rank_leaves_half_written_files_or_the_lock(killed_run: tuple[Path, str]) -> None:
    logdir, _ = killed_run
    assert not (logdir / "profcallbacks" / RUN_LOCK).exists()
    staging = logdir / STAGING_DIR
    # no claim of a rank torchrun stopped, no raw save of the killed rank's open window: each
    # rank's export helper outlives it, finishes what it was given and removes the rest
    left = sorted(p.name for p in staging.iterdir()) if staging.exists() else []
    assert left == [], left
    assert not [p for p in logdir.rglob("*") if p.name.endswith((".writing", ".tmp"))]


@pytest.mark.parametrize("rank", range(4))
def test_each_rank_keeps_a_row_for_every_step_it_finished(killed_run: tuple[Path, str],
                                                         rank: int) -> None:
    logdir, _ = killed_run
    path = logdir / "profcallbacks" / f"rank{rank}.steps.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows and all(r["rank"] == rank for r in rows)
    assert rows[0]["first_step"] == 0
    for before, after in zip(rows, rows[1:], strict=False):  # one row per stretch, none missing
        assert after["first_step"] == before["last_step"] + 1, (before, after)
    if rank == KILLED:  # SIGKILL: what it had written (rows wait up to a second in memory)
        assert rows[-1]["last_step"] < KILL_STEP
    else:  # stopped by torchrun's SIGTERM while closing: all its steps, to the last one
        assert rows[-1]["last_step"] == KILL_STEP, rows[-1]


def test_the_report_reads_the_run(killed_run: tuple[Path, str],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    logdir, _ = killed_run
    capsys.readouterr()
    assert main(["report", str(logdir)]) == 0
    out = capsys.readouterr().out
    assert "ranks: 0, 1, 2, 3 (world size 4)" in out and "step000005-schedule-partial" in out
