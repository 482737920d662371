"""`profcallbacks watch`: a real tmux pane against a training process, --once, a missing directory,
truncated and rotated files, many ranks, memory scalars and capture verdicts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from profcallbacks.cli import main
from profcallbacks.findings import CAPTURE_VERDICT
from profcallbacks.layout import META_DIR, capture_dir_name
from profcallbacks.watch import JsonlTail
from watch_train import train

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
                PYTHONFAULTHANDLER="1")


def _row(rank: int, first: int, last: int, median_ms: float, **extra: float) -> str:
    row = {"rank": rank, "first_step": first, "last_step": last, "steps": last - first + 1,
           "step_time_ms": median_ms * 1.1, "step_time_ms_median": median_ms,
           "step_time_ms_max": median_ms * 2, "data_wait_ms": median_ms / 4, "data_wait_share": 0.25,
           **extra}
    return json.dumps(row) + "\n"


def _once(capsys: pytest.CaptureFixture[str], logdir: Path) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["watch", str(logdir), "--once"])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logdir = tmp_path_factory.mktemp("watch") / "run"
    train(logdir, steps=60, sleep_s=0.0, delay_s=0.0008, log_every=10)
    return logdir


def test_once_prints_one_frame_of_a_real_run(stalled_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _once(capsys, stalled_run)
    assert code == 0
    # header: steps read from the steps file; the scheduled capture and the automatic baseline
    assert "ranks 1  step 59  captures 2" in out
    assert "step000041-schedule" in out
    assert "dataloader_stall" in out and "warning" in out
    assert "run ended" in out  # closed: its run marker is gone
    assert "\x1b[" not in out  # not a terminal: plain text, no escape codes


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _once(capsys, tmp_path / "not-yet")
    assert code == 2 and f"waiting for {tmp_path / 'not-yet'} to appear" in out


def test_waits_for_a_missing_directory_and_exits_0_on_ctrl_c(tmp_path: Path) -> None:
    logdir = tmp_path / "later"
    proc = subprocess.Popen([sys.executable, "-m", "profcallbacks.cli", "watch", str(logdir),
                             "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        _wait_for(lines, "waiting for")
        time.sleep(1.0)
        assert proc.poll() is None  # still waiting, not failed
        (logdir / META_DIR).mkdir(parents=True)
        (logdir / META_DIR / "rank0.steps.jsonl").write_text(_row(0, 0, 9, 3.0) + _row(0, 10, 19, 3.5))
        _wait_for(lines, "step 19")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # where it is stuck: faulthandler prints every thread
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=30)
            raise AssertionError("watch did not end on Ctrl-C:\n" + proc.stderr.read()) from None
        reader.join(timeout=10)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def _wait_for(lines: list[str], text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {''.join(lines)!r}"
        time.sleep(0.1)


def test_a_parent_directory_follows_its_one_run(stalled_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(stalled_run, tmp_path / "lightning_logs" / "version_0")
    code, out = _once(capsys, tmp_path / "lightning_logs")
    assert code == 0 and "lightning_logs/version_0" in out and "dataloader_stall" in out
    shutil.copytree(stalled_run, tmp_path / "lightning_logs" / "version_1")
    code, out = _once(capsys, tmp_path / "lightning_logs")
    assert code == 0 and "holds 2 runs (version_0, version_1): watch one" in out


def test_truncated_last_line_is_held_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = tmp_path / META_DIR / "rank0.steps.jsonl"
    steps.parent.mkdir()
    whole = _row(0, 20, 29, 5.0)
    steps.write_text(_row(0, 0, 9, 4.0) + _row(0, 10, 19, 4.0) + whole[:40])
    code, out = _once(capsys, tmp_path)
    assert code == 0 and "step 19" in out and "unreadable" not in out
    tail = JsonlTail(steps)
    assert [r["last_step"] for r in tail.read().rows] == [9, 19]
    with open(steps, "a") as f:
        f.write(whole[40:])  # the writer finishes its line
    batch = tail.read()
    assert [r["last_step"] for r in batch.rows] == [29] and batch.bad_lines == 0


def test_truncated_and_rotated_files_are_read_again(tmp_path: Path) -> None:
    path = tmp_path / "rank0.steps.jsonl"
    path.write_text(_row(0, 0, 9, 4.0) + _row(0, 10, 19, 4.0))
    tail = JsonlTail(path)
    assert len(tail.read().rows) == 2 and tail.read().rows == []  # only appended bytes
    path.write_text(_row(0, 0, 4, 4.0))  # truncated and rewritten
    batch = tail.read()
    assert batch.reset and [r["last_step"] for r in batch.rows] == [4]
    rotated = tmp_path / "new"
    rotated.write_text(_row(0, 0, 9, 4.0) + _row(0, 10, 19, 4.0) + _row(0, 20, 29, 4.0))
    os.replace(rotated, path)  # a new file under the old name, larger than the offset
    batch = tail.read()
    assert batch.reset and len(batch.rows) == 3
    path.unlink()
    assert tail.read().reset
    path.write_text("not json\n" + _row(0, 0, 0, 1.0))
    batch = tail.read()
    assert batch.bad_lines == 1 and len(batch.rows) == 1


def test_many_ranks_collapse_to_a_summary_and_the_slowest(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    meta = tmp_path / META_DIR
    meta.mkdir()
    for rank in range(70):
        median = 90.0 + rank if rank >= 60 else 10.0  # ranks 60-69 are slow
        (meta / f"rank{rank}.steps.jsonl").write_text(_row(rank, 0, 9, median))
    code, out = _once(capsys, tmp_path)
    assert code == 0 and "all 70" in out and "70 ranks: all-rank summary, then the 15 slowest" in out
    lines = out.splitlines()
    shown = {int(line.split()[1]) for line in lines if line.startswith("│") and line.split()[1].isdigit()}
    assert set(range(60, 70)) <= shown and len(shown) == 15  # every slow rank, and 5 others
    assert lines.index(next(x for x in lines if " 69 " in x)) < lines.index(next(x for x in lines
                                                                                if " 60 " in x))


def test_memory_scalars_and_capture_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = tmp_path / META_DIR
    meta.mkdir()
    (meta / "rank0.steps.jsonl").write_text(_row(0, 0, 9, 4.0) + _row(
        0, 10, 19, 4.0, memory_allocated_mb=1234.0, process_rss_mb=2048.0)
        + _row(0, 20, 29, 4.0))  # memory is sampled every sample_every_s, not at every summary
    (tmp_path / capture_dir_name(5, "schedule")).mkdir()
    (tmp_path / capture_dir_name(5, "schedule") / "rank0_host.5.pt.trace.json.gz").write_bytes(b"x")
    verdict = {"kind": CAPTURE_VERDICT, "step": 7, "rank": 0, "severity": "info",
               "message": "capture step000005-schedule: input_bound",
               "details": {"capture": "step000005-schedule",
                           "verdict": {"kind": "input_bound", "share": 0.8, "evidence": [], "advice": []}}}
    (meta / "rank0.findings.jsonl").write_text(json.dumps(verdict) + "\n")
    code, out = _once(capsys, tmp_path)
    assert code == 0
    assert "memory MB" in out and "alloc 1,234" in out and "rss 2,048" in out
    assert "input_bound (80%)" in out
    (tmp_path / capture_dir_name(9, "manual")).mkdir()
    report = {"verdict": {"kind": "host_bound", "share": 0.55},
              "captures": [{"directory": capture_dir_name(9, "manual"),
                            "verdict": {"kind": "sync_bound", "share": 0.3}}]}
    (tmp_path / "report.json").write_text(json.dumps(report))
    capsys.readouterr()
    assert main(["watch", str(tmp_path), "--once", "--report", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    assert "verdict host_bound (55%)" in out and "sync_bound (30%)" in out and "input_bound (80%)" in out


def test_memory_of_a_real_run_and_none_without(stalled_run: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert "memory MB" in _once(capsys, stalled_run)[1] and " rss " in _once(capsys, stalled_run)[1]
    (tmp_path / META_DIR).mkdir()
    (tmp_path / META_DIR / "rank0.steps.jsonl").write_text(_row(0, 0, 9, 4.0))
    assert "memory MB" not in _once(capsys, tmp_path)[1]


# --- a real terminal ----------------------------------------------------------------------------

def _pane(socket: str) -> str:
    return subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-t", "watch"],
                          capture_output=True, text=True).stdout


def _last_step(pane: str) -> int:
    """The step column of rank 0's row in the pane (-1 before there is one)."""
    cells = [line.split("│") for line in pane.splitlines() if line.startswith("│")]
    steps = [int(c[2]) for c in cells if len(c) > 2 and c[1].strip() == "0" and c[2].strip().isdigit()]
    return steps[0] if steps else -1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_watch_in_tmux_while_a_job_trains(tmp_path: Path) -> None:
    """watch in a real tmux pane, started before the job: steps, a stall finding and a capture appear
    while the training process still runs; a resize redraws it; Ctrl-C ends it with status 0."""
    logdir = tmp_path / "live"
    socket = f"pcw-{uuid.uuid4().hex[:8]}"
    cmd = (f"env PYTHONPATH={SRC} {sys.executable} -m profcallbacks.cli watch {logdir} --interval 0.5; "
           "echo WATCH-EXIT=$?; sleep 120")
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", "watch", "-x", "150", "-y", "50",
                    cmd], check=True, env=_env())
    trainer = None
    try:
        time.sleep(1.0)
        trainer = subprocess.Popen([sys.executable, str(TESTS / "watch_train.py"), str(logdir),
                                    "--steps", "100000", "--delay-ms", "0.6", "--log-every", "10"],
                                   env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        pane = ""
        while time.monotonic() < deadline:
            pane = _pane(socket)
            if "dataloader_stall" in pane and "step000081-schedule" in pane and _last_step(pane) >= 79:
                break
            time.sleep(0.5)
        assert trainer.poll() is None, "the job ended before watch showed it"
        (tmp_path / "pane.txt").write_text(pane)
        assert "dataloader_stall" in pane and "warning" in pane, pane
        assert "step000041-schedule" in pane and "step000081-schedule" in pane, pane
        assert _last_step(pane) >= 79, pane  # the rank row: summaries of steps 0-79 at least
        assert "run ended" not in pane, pane  # its run marker is there while it trains
        subprocess.run(["tmux", "-L", socket, "resize-window", "-t", "watch", "-x", "110", "-y", "45"],
                       check=True)
        time.sleep(2.0)
        resized = _pane(socket)
        assert resized.count("profcallbacks watch") == 1, resized  # redrawn whole, no stale frame
        assert max(len(line) for line in resized.splitlines()) <= 110 and "dataloader_stall" in resized
        subprocess.run(["tmux", "-L", socket, "send-keys", "-t", "watch", "C-c"], check=True)
        for _ in range(40):
            if "WATCH-EXIT=" in (pane := _pane(socket)):
                break
            time.sleep(0.25)
        assert "WATCH-EXIT=0" in pane and "Traceback" not in pane, pane
    finally:
        if trainer is not None:
            trainer.terminate()
            trainer.wait(timeout=30)
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def test_a_rewritten_findings_file_is_not_counted_twice(tmp_path: Path) -> None:
    from profcallbacks.watch.state import LogdirState

    meta = tmp_path / META_DIR
    meta.mkdir()
    findings = meta / "rank0.findings.jsonl"

    def finding(step: int) -> str:
        return json.dumps({"kind": "dataloader_stall", "step": step, "rank": 0,
                           "severity": "warning", "message": f"stall at {step}", "details": {}}) + "\n"

    findings.write_text(finding(10) + finding(20))
    state = LogdirState(tmp_path)
    state.poll()
    assert state.findings_total == 2
    findings.write_text(finding(10))  # truncated and rewritten (e.g. a restarted run)
    state.poll()
    assert state.findings_total == 1 and [f["step"] for f in state.findings] == [10]


def test_steps_rows_carry_the_slowdown_ratio_that_watch_shows(tmp_path: Path) -> None:
    from profcallbacks import ProfilerConfig, SlowdownConfig
    from profcallbacks.layout import steps_file
    from profcallbacks.testing import ScriptedRun
    from profcallbacks.watch.state import LogdirState

    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, watch_capture_file=False,
                            sync_audit=False, stall=None, memory=None, log_every_n_steps=20,
                            baseline_capture=False,
                            slowdown=SlowdownConfig(warmup_steps=0, baseline_steps=10,
                                                    baseline_block_s=0.0, baseline_blocks=1))
    run = ScriptedRun(config, tmp_path)
    run.steps([(0.010, 0.0)] * 100)
    run.close()
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    assert rows[-1]["slowdown_ratio"] == pytest.approx(1.0, abs=0.05)
    assert rows[-1]["baseline_step_time_ms"] == pytest.approx(10.0, rel=0.05)
    state = LogdirState(tmp_path)
    state.poll()
    assert state.ranks[0].slowdown_ratio == pytest.approx(1.0, abs=0.05)
