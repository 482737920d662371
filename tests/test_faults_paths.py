"""Log directory names and threads that used to cost every capture: a line break in the name, a
name too long for the files below it, ``step()`` called from a background thread."""

from __future__ import annotations

import threading

import pytest

from helpers import captured_steps, load_trace, tiny_model, trace_files, train_step
from profcallbacks import Schedule, StepProfiler

SCHEDULE = Schedule(skip_first=1, warmup=0, active=2, repeat=1)


def _profiler(logdir):
    return StepProfiler(logdir, schedule=SCHEDULE, stall=None, slowdown=None, sync_audit=False,
                        memory=None, tensorboard_scalars=False)


def _steps(prof, n=5):
    model, opt = tiny_model()
    for _ in range(n):
        train_step(model, opt)
        prof.step()


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_a_line_break_in_the_logdir_still_gets_its_captures(tmp_path, monkeypatch, relative):
    logdir = tmp_path / "runs" / "a\nb"
    if relative:  # the link kineto saves through lies elsewhere: it must not point back relatively
        monkeypatch.chdir(tmp_path)
        logdir = logdir.relative_to(tmp_path)
    with _profiler(logdir) as prof:
        _steps(prof)
    assert captured_steps(tmp_path / "runs" / "a\nb") == {"step000001-schedule": [1, 2]}


def test_a_logdir_too_long_for_its_files_is_refused_at_start(tmp_path):
    logdir = tmp_path.joinpath(*["d" * 200] * ((4000 - len(str(tmp_path))) // 201))
    assert len(str(logdir)) < 4096 - 100  # the directory itself could be created
    with pytest.raises(ValueError, match="too long.*pass a shorter log directory"):
        with _profiler(logdir):
            pass


def test_steps_from_a_background_thread_put_step_ranges_on_its_thread(tmp_path):
    prof = _profiler(tmp_path)
    with prof:
        worker = threading.Thread(target=_steps, args=(prof,))
        worker.start()
        worker.join()
    (trace_file,) = trace_files(tmp_path / "step000001-schedule")
    events = [e for e in load_trace(trace_file)["traceEvents"] if e.get("ph") == "X"]
    step_tids = {e["tid"] for e in events if e["name"].startswith("ProfilerStep#")}
    op_tids = {e["tid"] for e in events if e["name"] == "aten::addmm"}
    assert op_tids and step_tids == op_tids
