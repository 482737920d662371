"""Issue 17 item 5: one live run per log directory; restarts never overwrite earlier captures;
stranded publishes are finished at the next start."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from helpers import capture_dirs, captured_steps, tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
from profcallbacks.layout import run_lock_file
from profcallbacks.run.runlock import STALE_S, LogdirInUseError


def _train(logdir, steps=8, **kwargs):
    model, opt = tiny_model()
    kwargs.setdefault("schedule", Schedule(skip_first=2, warmup=0, active=2, repeat=1))
    with StepProfiler(logdir, stall=None, slowdown=None, sync_audit=False, **kwargs) as prof:
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    return prof


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_in_a_live_runs_logdir_fails_at_start(tmp_path):
    model, opt = tiny_model()
    with StepProfiler(tmp_path, schedule=None) as first:
        with pytest.raises(LogdirInUseError) as info, StepProfiler(tmp_path, schedule=None):
            pass
        message = str(info.value)
        assert repr(str(tmp_path)) in message and "log directory of its own" in message
        assert str(run_lock_file(tmp_path)) in message
        train_step(model, opt)
        first.step()  # the first run is untouched
    assert not run_lock_file(tmp_path).exists()  # released at close
    _train(tmp_path)  # and the directory is free again


def test_a_fresh_marker_from_another_host_is_respected(tmp_path):
    marker = run_lock_file(tmp_path)
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"host": "other-node", "pid": 1, "token": "x"}))
    with pytest.raises(LogdirInUseError, match="pid 1 on other-node"):
        _train(tmp_path)
    old = time.time() - STALE_S - 5  # not refreshed for longer than STALE_S: that run is gone
    os.utime(marker, (old, old))
    _train(tmp_path)


def test_restart_after_a_killed_run_keeps_its_captures(tmp_path, caplog):
    _train(tmp_path)
    (first,) = capture_dirs(tmp_path)
    original = {p.name: p.read_bytes() for p in first.iterdir()}
    marker = run_lock_file(tmp_path)  # as kill -9 leaves it: a marker of a dead process
    marker.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "token": "x"}))
    with caplog.at_level(logging.WARNING):
        _train(tmp_path)
    assert "ended without closing" in caplog.text
    assert [d.name for d in capture_dirs(tmp_path)] == ["step000002-schedule",
                                                        "step000002-schedule-2"]
    assert {p.name: p.read_bytes() for p in first.iterdir()} == original
    assert captured_steps(tmp_path) == {"step000002-schedule": [2, 3],
                                        "step000002-schedule-2": [2, 3]}


def test_a_stranded_publish_is_finished_at_the_next_start(tmp_path, caplog):
    _train(tmp_path)
    (published,) = capture_dirs(tmp_path)
    (trace,) = published.glob("*.pt.trace.json.gz")
    stage = tmp_path / ".profcallbacks-staging" / "step000020-slowdown"  # killed mid-publish
    (stage / ".publishing").mkdir(parents=True)
    shutil.copy(trace, stage / (trace.name + ".ready"))
    (stage / ".rank1_x.20.pt.trace.json.gz.writing").write_bytes(b"\x1f\x8b half")
    (published / ".publishing").mkdir()  # killed between the rename and removing the lock
    old = time.time() - 60
    os.utime(stage, (old, old))
    with caplog.at_level(logging.WARNING):
        _train(tmp_path, schedule=None)
    assert "published stranded capture step000020-slowdown" in caplog.text
    assert "removed 1 half-written trace file(s) of capture step000020-slowdown" in caplog.text
    assert "removed a leftover publish lock from step000002-schedule" in caplog.text
    assert (tmp_path / "step000020-slowdown" / trace.name).read_bytes() == trace.read_bytes()
    assert not (tmp_path / ".profcallbacks-staging").exists()
    assert not (published / ".publishing").exists()


@pytest.mark.slow
def test_kill_9_then_restart_in_the_same_logdir(tmp_path):
    script = f"""
import sys, time
sys.path.insert(0, {str(os.path.dirname(__file__))!r})
from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
model, opt = tiny_model()
with StepProfiler({str(tmp_path)!r}, schedule=Schedule(skip_first=2, warmup=0, active=2,
                  repeat=1)) as prof:
    for step in range(10**9):
        train_step(model, opt); prof.step()
        if step == 20: print("ready", flush=True)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    with pytest.raises(LogdirInUseError):  # live in another process
        _train(tmp_path)
    deadline = time.monotonic() + 60  # the export helper publishes in the background
    while not (tmp_path / "step000002-schedule").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    before = {d.name: sorted(p.name for p in d.iterdir()) for d in capture_dirs(tmp_path)}
    _train(tmp_path)
    after = {d.name: sorted(p.name for p in d.iterdir()) for d in capture_dirs(tmp_path)}
    assert "step000002-schedule" in before
    assert all(after[name] == files for name, files in before.items())  # none overwritten
    assert "step000002-schedule-2" in after


def test_a_refused_run_leaves_no_export_helper_behind(tmp_path):
    psutil = pytest.importorskip("psutil")

    def helpers() -> set[int]:
        return {p.pid for p in psutil.Process().children(recursive=True)
                if p.status() != psutil.STATUS_ZOMBIE}

    with StepProfiler(tmp_path, tensorboard_scalars=False):
        running = helpers()
        assert running  # the live run's own export helper
        with pytest.raises(LogdirInUseError):
            StepProfiler(tmp_path, tensorboard_scalars=False).__enter__()
        assert helpers() == running  # the refused run's helper was stopped with it
