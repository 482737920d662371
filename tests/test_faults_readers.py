"""``watch`` and ``report`` on a hostile log directory: only regular files are read, non-blocking
and size-capped before reading; no link out of the log directory is followed (the report says
so); an ASCII locale and a deleted log directory are handled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from faults_helpers import copied_run, small_run
from profcallbacks.report import build_report, locate_run
from profcallbacks.watch.state import LogdirState

ROW = {"rank": 0, "first_step": 0, "last_step": 9, "steps": 10, "step_time_ms_median": 5.0}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("base") / "run", 12, memory=None,
                     tensorboard_scalars=False)


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    return copied_run(base_run, tmp_path)


def _in_time(action, timeout_s: float = 30.0):
    """``action()``'s result; fails when it blocks (a FIFO) or takes minutes (a huge file)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(action()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "blocked"
    return out[0]


def _meta(logdir: Path) -> Path:
    return logdir / "profcallbacks"


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "sparse_8g"])
def test_watch_reads_only_regular_files_and_not_too_much(run, kind):
    bad = _meta(run) / "rank1.steps.jsonl"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "dev_zero":
        bad.symlink_to("/dev/zero")
    else:
        with open(bad, "wb") as f:
            f.seek(8 << 30)  # sparse: no disk used, 8 GiB of zeros to a reader
            f.write(b"\n" + json.dumps({**ROW, "rank": 1}).encode() + b"\n")
    state = LogdirState(run)
    assert _in_time(state.poll)
    assert 0 in state.ranks
    if kind != "sparse_8g":
        assert 1 not in state.ranks
    else:  # the latest rows of a huge file are read; the zeros are not held in memory
        assert state.ranks[1].last_step == 9


def test_watch_never_follows_links_out_of_the_logdir(run, base_run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(base_run / "step000002-schedule", elsewhere / "step000050-manual")
    (run / "step000050-manual").symlink_to(elsewhere / "step000050-manual")
    (_meta(run) / "rank3.steps.jsonl").symlink_to(_meta(base_run) / "rank0.steps.jsonl")
    state = LogdirState(run)
    state.poll()
    assert "step000050-manual" not in state.captures and "step000002-schedule" in state.captures
    assert 3 not in state.ranks


def test_report_names_links_out_of_the_logdir_and_does_not_read_them(run, base_run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(base_run / "step000002-schedule", elsewhere / "step000050-manual")
    (run / "step000050-manual").symlink_to(elsewhere / "step000050-manual")
    (_meta(run) / "rank3.steps.jsonl").symlink_to(_meta(base_run) / "rank0.steps.jsonl")
    report = build_report(locate_run(run))
    problems = {Path(p["file"]).name: p["error"] for p in report["problems"]}
    assert "link out of the log directory" in problems["step000050-manual"]
    assert "link out of the log directory" in problems["rank3.steps.jsonl"]
    assert [Path(c["directory"]).name for c in report["captures"]] == ["step000002-schedule"]


def test_report_refuses_a_huge_steps_file_before_reading_it(run):
    huge = _meta(run) / "rank1.steps.jsonl"
    with open(huge, "wb") as f:
        f.truncate((1 << 30) + 1)  # sparse, a byte over the cap
    report = _in_time(lambda: build_report(locate_run(run)))
    (error,) = [p["error"] for p in report["problems"] if p["file"] == str(huge)]
    assert f"{(1 << 30) + 1} bytes" in error and "not read" in error


def test_watch_drops_what_disappears(run):
    state = LogdirState(run)
    state.poll()
    assert state.captures and state.ranks
    shutil.rmtree(run / "step000002-schedule")
    state.poll()
    assert not state.captures
    shutil.rmtree(run)
    assert state.poll() is True  # the change is shown once
    assert not state.captures and not state.ranks and not state.exists


def test_an_ascii_locale_and_a_non_ascii_path(base_run, tmp_path):
    logdir = tmp_path / "ünïcode-rün"
    shutil.copytree(base_run, logdir)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("PYTHONIOENCODING", None)
    for command in (["report", str(logdir)], ["watch", "--once", str(logdir)]):
        proc = subprocess.run([sys.executable, "-m", "profcallbacks.cli", *command],
                              capture_output=True, env=env, timeout=120)
        err = proc.stderr.decode("ascii", errors="replace")
        assert proc.returncode == 0 and "UnicodeEncodeError" not in err, (command, err[-2000:])
        assert b"step000002-schedule" in proc.stdout
