"""Issue 17 items 2-4: a hostile CAPTURE file never blocks, slows or switches off captures;
capture lengths have a cap."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from helpers import captured_steps, tiny_model, train_step
from profcallbacks import StepProfiler
from profcallbacks.capture.capture_file import CaptureFileTrigger
from profcallbacks.capture.planner import MAX_CAPTURE_STEPS


def _train(logdir, steps, *, before_step=None, timeout_s=20.0, **kwargs):
    """Trains in a thread so a hang fails the test instead of blocking it; returns the profiler."""
    model, opt = tiny_model()
    result: dict = {}

    def run():
        with StepProfiler(logdir, schedule=None, capture_file_poll_s=0.001, stall=None,
                          slowdown=None, sync_audit=False, **kwargs) as prof:
            for step in range(steps):
                if before_step is not None:
                    before_step(step, prof)
                train_step(model, opt)
                prof.step()
        result["prof"] = prof

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "training hung"
    assert "prof" in result, "training raised"
    return result["prof"]


def _warnings(caplog, word="CAPTURE"):
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and word in r.getMessage()]


def test_a_fifo_named_capture_never_blocks_training(tmp_path, caplog):
    os.mkfifo(tmp_path / "CAPTURE")
    with caplog.at_level(logging.WARNING):
        prof = _train(tmp_path, 10)
    assert prof.session.step == 10
    assert len(_warnings(caplog)) == 1 and "not a regular file" in _warnings(caplog)[0]
    assert not (tmp_path / "CAPTURE").exists()  # the FIFO itself is removed, so it is seen once


def test_capture_symlink_to_dev_zero_is_not_read(tmp_path, caplog):
    os.symlink("/dev/zero", tmp_path / "CAPTURE")
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        _train(tmp_path, 10)
    assert time.perf_counter() - start < 10
    assert len(_warnings(caplog)) == 1 and "not a regular file" in _warnings(caplog)[0]
    assert os.path.exists("/dev/zero") and not os.path.lexists(tmp_path / "CAPTURE")


def test_a_huge_capture_file_is_not_read(tmp_path, caplog):
    path = tmp_path / "CAPTURE"
    with open(path, "wb") as f:
        f.truncate(200 << 20)  # 200 MB (sparse)
    trigger = CaptureFileTrigger(tmp_path, poll_s=1.0)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        assert trigger.poll(0.0) is None
    assert time.perf_counter() - start < 0.1
    assert "209715200 bytes" in _warnings(caplog)[0]


@pytest.mark.parametrize("text", ["²", "9" * 5000, "-3", "0", "five", "1e3", "٣"])
def test_a_bad_value_warns_once_and_captures_go_on(tmp_path, caplog, text):
    def before_step(step, prof):
        if step == 2:
            (tmp_path / "CAPTURE").write_text(text)
        if step == 10:
            prof.capture(steps=2)
        if step == 20:
            (tmp_path / "CAPTURE").write_text("2")

    with caplog.at_level(logging.WARNING):  # polled once per block (<= capture_file_poll_s)
        _train(tmp_path, 50, before_step=before_step)
    assert len(_warnings(caplog)) == 1 and "not a step count" in _warnings(caplog)[0]
    assert not _warnings(caplog, "captures failed")
    steps = captured_steps(tmp_path)
    assert steps["step000012-manual"] == [12, 13]  # a later capture() still works
    (file_steps,) = [s for name, s in steps.items() if name.endswith("-file")]
    assert len(file_steps) == 2 and file_steps[0] > 20  # the CAPTURE file still works too


def test_a_directory_named_capture_warns_once(tmp_path, caplog):
    (tmp_path / "CAPTURE").mkdir()
    with caplog.at_level(logging.WARNING):
        _train(tmp_path, 20)
    assert len(_warnings(caplog)) == 1


def test_capture_file_count_above_the_cap_is_lowered_to_it(tmp_path, caplog):
    (tmp_path / "CAPTURE").write_text("99999999")
    trigger = CaptureFileTrigger(tmp_path, poll_s=1.0)
    with caplog.at_level(logging.WARNING):
        assert trigger.poll(0.0) == MAX_CAPTURE_STEPS
    assert f"capturing {MAX_CAPTURE_STEPS}" in caplog.text


def test_a_requested_window_ends_at_the_cap():
    from profcallbacks.capture.planner import CapturePlanner
    from profcallbacks.options.schedule import Phase

    planner = CapturePlanner(None, max_captures=5)
    planner.request(99999999, "file")  # whatever asks: the window still ends
    phases = [planner.phase_for(step) for step in range(MAX_CAPTURE_STEPS + 10)]
    assert phases.count(Phase.ACTIVE) == MAX_CAPTURE_STEPS
    assert phases[-1] is Phase.IDLE


@pytest.mark.parametrize("steps", [MAX_CAPTURE_STEPS + 1, 99999999, 10**400])
def test_capture_steps_above_the_cap_rejected(tmp_path, steps):
    with StepProfiler(tmp_path, schedule=None) as prof:
        with pytest.raises(ValueError, match=rf"between 1 and {MAX_CAPTURE_STEPS}"):
            prof.capture(steps=steps)
        prof.capture(steps=MAX_CAPTURE_STEPS)  # the cap itself is fine
