"""Capture windows on real loops: the export helper process, freeing recorded events, windows
recorded during an export, partial captures after a hung export, an exception or SIGINT."""

from __future__ import annotations

import gc
import gzip
import json
import os
import signal
import time
import weakref
from pathlib import Path

import pytest
import torch

from helpers import capture_dirs, tiny_model, train_step
from profcallbacks import Schedule, StepProfiler, TraceOptions
from profcallbacks.capture import controller
from profcallbacks.capture import exporter as export_helper


def test_export_runs_in_a_helper_process_that_ends_with_the_run(tmp_path):
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=2),
                        tensorboard_scalars=False)
    with prof:
        for _ in range(6):
            train_step(model, opt)
            prof.step()
        pid = prof.session.export_helper_pid
        assert pid is not None and pid != os.getpid() and Path(f"/proc/{pid}").exists()
    assert prof.session.export_helper_pid is None
    assert not Path(f"/proc/{pid}").exists()  # the helper never outlives the run (and was reaped)
    (capture,) = capture_dirs(tmp_path)
    (trace_file,) = capture.glob("*.pt.trace.json.gz")
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    assert trace["profcallbacks"]["steps"] == [2, 3]  # post-processed by the helper
    assert not list(tmp_path.rglob("*.raw.json"))


def test_a_captures_events_are_freed_at_a_pause_not_by_the_collector_mid_training(tmp_path):
    """Freeing a window's recorded events costs ~0.4 s for a large trace: it happens at the
    next pause (or window, or the end), by reference count, never in some later training step
    when the collector gets to the profiler's reference cycle."""
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=2),
                        tensorboard_scalars=False)
    earlier = {id(o) for o in gc.get_objects() if isinstance(o, torch.profiler.profile)}
    gc.disable()
    try:
        with prof:
            for _ in range(8):
                train_step(model, opt)
                prof.step()
            retired = [o for o in gc.get_objects()  # the exported window's torch profilers:
                       if isinstance(o, torch.profiler.profile) and id(o) not in earlier
                       and o.profiler is not None]  # its first step's, and the rest's
            assert len(retired) == 2
            events = [weakref.ref(o.profiler) for o in retired]
            del retired
            for _ in range(3):
                train_step(model, opt)
                prof.step()
            assert all(e() is not None for e in events)  # steps never pay for freeing them
            prof.pause()
            assert all(e() is None for e in events)  # freed here, with the collector off
    finally:
        gc.enable()
    assert len(capture_dirs(tmp_path)) == 1


def back_to_back_windows(logdir) -> None:
    """Two one-step windows in a row: the second is recorded while the first is exported."""
    model, opt = tiny_model()
    schedule = Schedule(skip_first=0, wait=0, warmup=0, active=1, repeat=2)
    with StepProfiler(logdir, schedule=schedule, tensorboard_scalars=False) as prof:
        for _ in range(4):
            train_step(model, opt)
            prof.step()


def test_a_window_recorded_during_an_export_is_marked(tmp_path):
    back_to_back_windows(tmp_path)
    marks = {}
    for capture in capture_dirs(tmp_path):
        (trace_file,) = capture.glob("*.pt.trace.json.gz")
        trace = json.loads(gzip.decompress(trace_file.read_bytes()))
        marks[capture.name] = trace["profcallbacks"]["export_overlap"]
    assert marks == {"step000000-schedule": False, "step000001-schedule": True}


def test_a_hung_export_still_publishes_the_raw_trace_as_partial(tmp_path, monkeypatch):
    """Issue 17 item 6: whatever happens to the writer, close publishes within a bounded wait."""
    from profcallbacks.capture import trace_writer as export

    monkeypatch.setattr(export_helper, "USE_HELPER_PROCESS", False)
    monkeypatch.setattr(export.CaptureWriter, "export", lambda *a: time.sleep(5))
    monkeypatch.setattr(export_helper, "CLOSE_BYTES_PER_S", 1e12)
    monkeypatch.setattr(controller, "CLOSE_WAIT_FAILED_S", 0.5)  # a wait the test can afford
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=2),
                        tensorboard_scalars=False)
    start = time.monotonic()
    with pytest.raises(KeyError), prof:  # a failed run: the open window is exported as partial
        for _ in range(3):
            train_step(model, opt)
            prof.step()
        raise KeyError("the training loop fails")
    assert time.monotonic() - start < 4
    (capture,) = capture_dirs(tmp_path)
    assert capture.name == "step000000-schedule-partial"
    (trace_file,) = capture.glob("*.pt.trace.json")
    assert json.loads(trace_file.read_text())["traceEvents"]


def test_exception_in_a_long_window_publishes_the_partial_capture(tmp_path):
    """Issue 17 item 6: 300 steps with stacks, then an exception: the -partial capture appears."""
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=1000),
                        trace=TraceOptions(with_stack=True), tensorboard_scalars=False)
    with pytest.raises(RuntimeError), prof:
        for _ in range(300):
            train_step(model, opt)
            prof.step()
        raise RuntimeError("boom")
    (capture,) = capture_dirs(tmp_path)
    assert capture.name == "step000000-schedule-partial"
    assert list(capture.glob("*.pt.trace.json.gz"))
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".writing", ".raw.json"))]


def test_sigint_while_a_window_stops_leaves_the_profiler_off_and_publishes(tmp_path,
                                                                            monkeypatch):
    """Issue 17 item 7: Ctrl-C inside the profiler's stop: state clean, capture published."""
    from torch.profiler import profile

    real_stop = profile.stop_trace

    def interrupted_stop(self):
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of kineto's stop
        return real_stop(self)

    monkeypatch.setattr(profile, "stop_trace", interrupted_stop)
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=100),
                        tensorboard_scalars=False)
    with pytest.raises(KeyboardInterrupt), prof:
        for _ in range(3):
            train_step(model, opt)
            prof.step()
        raise KeyboardInterrupt  # the first Ctrl-C; the second comes during the stop
    assert not torch.autograd.profiler._is_profiler_enabled
    (capture,) = capture_dirs(tmp_path)
    assert capture.name == "step000000-schedule-partial"


def test_the_report_marks_a_capture_recorded_during_an_export(tmp_path):
    from profcallbacks.report import build_report, locate_run, render_text

    back_to_back_windows(tmp_path)
    report = build_report(locate_run(tmp_path))
    marks = {c["directory"]: c["export_overlap"] for c in report["captures"]}
    assert marks == {"step000000-schedule": False, "step000001-schedule": True}
    assert "schedule (during an export)" in render_text(report)
