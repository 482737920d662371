"""`profcallbacks open`: the chosen trace served once to the Perfetto UI from 127.0.0.1, with the CORS
header the UI needs; a taken port and a missing capture are refused with a message."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
from profcallbacks.viewer import PERFETTO_ORIGIN, ChoiceError, choose_trace

SRC = str(Path(__file__).resolve().parents[1] / "src")
TRACE = Path(__file__).parent / "data" / "hta-traces" / "cpu_only_no_distributed_info.pt.trace.json.gz"


def _two_rank_run(root: Path) -> Path:
    """A log directory as a two-rank job leaves it: two captures, the later one merged."""
    for step in (3, 20):
        capture = root / f"step{step:06d}-schedule"
        capture.mkdir(parents=True)
        for rank in (0, 1):
            shutil.copy(TRACE, capture / f"rank{rank}_host_{100 + rank}.{step}.pt.trace.json.gz")
        shutil.copy(TRACE, capture / f"all-ranks.{step}.trace.json.gz")
        with open(capture / f"all-ranks.{step}.trace.json.gz", "ab") as f:
            f.write(b"merged")  # tells it apart from the rank files
    return root


def _open(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "profcallbacks.cli", "open", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _served_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip().startswith(PERFETTO_ORIGIN):
            return line.strip()
    raise AssertionError(f"no URL printed; stderr: {proc.stderr.read() if proc.stderr else ''}")


def test_serves_the_latest_merged_capture_once_with_the_cors_header(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path / "run")
    proc = _open(str(run), "--no-browser", "--port", "0")
    try:
        url = _served_url(proc)
        assert url.startswith(f"{PERFETTO_ORIGIN}/#!/?url=http://127.0.0.1:")
        trace_url = url.split("url=", 1)[1]
        assert trace_url.endswith("/all-ranks.20.trace.json.gz")
        with urllib.request.urlopen(trace_url, timeout=30) as answer:
            assert answer.headers["Access-Control-Allow-Origin"] == PERFETTO_ORIGIN
            body = answer.read()
        assert body == (run / "step000020-schedule" / "all-ranks.20.trace.json.gz").read_bytes()
        assert proc.wait(timeout=30) == 0  # stops after the one fetch
    finally:
        proc.kill()


def test_a_taken_port_is_refused_with_a_message(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path / "run")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _open(str(run), "--no-browser", "--port", str(port))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port N" in err


def test_capture_rank_and_merged_choose_within_a_run(tmp_path: Path) -> None:
    run = _two_rank_run(tmp_path / "run")
    assert choose_trace(run, rank=1).name == "rank1_host_101.20.pt.trace.json.gz"
    assert choose_trace(run, capture="step000003-schedule", merged=True).name == "all-ranks.3.trace.json.gz"
    with pytest.raises(ChoiceError, match="no trace of rank 5; its ranks: 0, 1"):
        choose_trace(run, rank=5)
    with pytest.raises(ChoiceError, match="no capture 'step000099-manual'"):
        choose_trace(run, capture="step000099-manual")
    assert choose_trace(TRACE) == TRACE


def test_a_real_single_rank_run_opens_its_latest_capture(tmp_path: Path) -> None:
    logdir = tmp_path / "run"
    model, opt = tiny_model()
    with StepProfiler(logdir, schedule=Schedule(skip_first=1, wait=1, warmup=0, active=1, repeat=2),
                      stall=None, slowdown=None, sync_audit=False, memory=None) as prof:
        for _ in range(8):
            train_step(model, opt)
            prof.step()
    chosen = choose_trace(logdir)
    captures = sorted(p.name for p in logdir.glob("step*-schedule"))
    assert len(captures) == 2 and chosen.parent.name == captures[-1]
    assert chosen.name.endswith(".pt.trace.json.gz")
