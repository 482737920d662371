"""Real captures on CPU, checked from the trace files."""

import json
import time

import pytest
import torch

from helpers import capture_dirs, captured_steps, load_trace, tiny_model, trace_files, train_step
from profcallbacks import Schedule, StepProfiler, TraceOptions
from profcallbacks.testing import StepRecorder


def run_loop(logdir, steps, schedule, on_step=None, **kwargs):
    model, opt = tiny_model()
    prof = StepProfiler(logdir, schedule=schedule, tensorboard_scalars=False, **kwargs)
    with prof:
        for i in range(steps):
            train_step(model, opt)
            prof.step()
            if on_step:
                on_step(prof, i)
    return prof


@pytest.mark.parametrize("schedule, expected", [
    (Schedule(skip_first=3, wait=2, warmup=1, active=4, repeat=2),
     {"step000006-schedule": [6, 7, 8, 9], "step000013-schedule": [13, 14, 15, 16]}),
    (Schedule(skip_first=0, wait=0, warmup=0, active=2, repeat=3),
     {"step000000-schedule": [0, 1], "step000002-schedule": [2, 3], "step000004-schedule": [4, 5]}),
    (Schedule(skip_first=5, wait=3, warmup=2, active=1, repeat=2),
     {"step000010-schedule": [10], "step000016-schedule": [16]}),
])
def test_scheduled_captures_hold_exactly_the_scheduled_steps(tmp_path, schedule, expected):
    prof = run_loop(tmp_path, 25, schedule)
    assert captured_steps(tmp_path) == expected
    assert sorted(p.name for p in prof.captures) == sorted(expected)


def test_manual_capture_starts_at_next_step_after_warmup(tmp_path):
    def trigger(prof, i):
        if i == 4:
            prof.capture(steps=3)
    run_loop(tmp_path, 15, Schedule(skip_first=100, warmup=1, active=2), on_step=trigger)
    # capture() during step 5 (after step 4 ended): step 6 warms up, 7-9 are recorded
    assert captured_steps(tmp_path) == {"step000007-manual": [7, 8, 9]}


def test_capture_file_is_consumed_and_holds_step_count(tmp_path):
    def drop_file(prof, i):
        if i == 2:
            (tmp_path / "CAPTURE").write_text("4\n")
    # the file is polled once per block of steps (blocks last at most capture_file_poll_s)
    run_loop(tmp_path, 40, None, on_step=drop_file, capture_steps=2, capture_file_poll_s=1e-6)
    assert not (tmp_path / "CAPTURE").exists()
    (name, steps), = captured_steps(tmp_path).items()
    assert name.endswith("-file") and len(steps) == 4
    assert steps == list(range(steps[0], steps[0] + 4))


def test_run_ending_inside_window_exports_partial(tmp_path):
    run_loop(tmp_path, 8, Schedule(skip_first=3, warmup=1, active=10))
    assert captured_steps(tmp_path) == {"step000004-schedule-partial": [4, 5, 6, 7]}
    trace = load_trace(trace_files(tmp_path / "step000004-schedule-partial")[0])
    assert trace["profcallbacks"]["partial"] is True


def test_run_ending_in_warmup_writes_nothing(tmp_path):
    run_loop(tmp_path, 4, Schedule(skip_first=2, warmup=3, active=2))
    assert capture_dirs(tmp_path) == []


def test_trace_has_rank_metadata_and_worker_names_rank(tmp_path):
    run_loop(tmp_path, 6, Schedule(skip_first=1, warmup=1, active=2))
    (path,) = trace_files(tmp_path / "step000002-schedule")
    assert path.name.startswith("rank0_") and path.name.endswith(".2.pt.trace.json.gz")
    trace = load_trace(path)
    assert trace["distributedInfo"]["rank"] == 0 and trace["distributedInfo"]["world_size"] == 1
    assert trace["profcallbacks"]["steps"] == [2, 3]


def test_step_ranges_contain_the_step_ops_and_dataloader_is_countable(tmp_path):
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 16)),
                                         batch_size=8)
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=3),
                        tensorboard_scalars=False)
    with prof:
        for (x,) in prof.wrap(loader):
            model(x).sum().backward()
            opt.step()
            prof.step()
    trace = load_trace(trace_files(tmp_path / "step000002-schedule")[0])
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    loads = [e for e in events if e["name"].startswith("enumerate(DataLoader)#")]
    assert len(loads) == 3 and all(e["cat"] == "cpu_op" for e in loads)
    for load in loads:  # each fetch lies inside exactly one step range
        inside = [s for s in steps if s["ts"] <= load["ts"] and
                  load["ts"] + load["dur"] <= s["ts"] + s["dur"]]
        assert len(inside) == 1
    optimizer_steps = [e for e in events if e["name"].startswith("Optimizer.step#")]
    assert len(optimizer_steps) == 3
    for s in steps:
        held = [o for o in optimizer_steps if s["ts"] <= o["ts"] <= s["ts"] + s["dur"]]
        assert len(held) == 1


def test_nothing_installed_outside_windows(tmp_path):
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=1),
                        tensorboard_scalars=False)
    with prof:
        for _ in range(6):
            train_step(model, opt)
            prof.step()
            assert prof.session.capture_open == (prof.session.step in (2, 3))
            assert torch.autograd.profiler._is_profiler_enabled == (prof.session.step == 3)


def test_step_summaries_written(tmp_path):
    run_loop(tmp_path, 25, None, log_every_n_steps=10)
    rows = [json.loads(line) for line in (tmp_path / "profcallbacks/rank0.steps.jsonl").open()]
    assert [(r["first_step"], r["last_step"]) for r in rows] == [(0, 9), (10, 19), (20, 24)]
    assert all(r["step_time_ms"] > 0 for r in rows)


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model, opt = tiny_model()
    with StepProfiler(tmp_path, schedule=None, log_every_n_steps=5) as prof:
        for _ in range(10):
            train_step(model, opt)
            prof.step()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "profcallbacks/step_time_ms" in tags and "profcallbacks/data_wait_ms" in tags
    assert [e.step for e in acc.Scalars("profcallbacks/step_time_ms")] == [4, 9]


def test_pause_excludes_work_between_steps(tmp_path):
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False)
    recorder = StepRecorder()
    prof.session.add_detector(recorder)
    with prof:
        for i in range(4):
            time.sleep(0.002)
            prof.step()
            if i == 1:
                prof.pause()
                time.sleep(0.2)
                prof.resume()
    times = [r.step_time_s for r in recorder.records]
    assert max(times) < 0.1
    assert [r.after_pause for r in recorder.records] == [True, False, True, False]


def test_trace_options_pass_through(tmp_path):
    run_loop(tmp_path, 4, Schedule(skip_first=1, warmup=0, active=1),
             trace=TraceOptions(with_stack=True, record_shapes=True))
    trace = load_trace(trace_files(tmp_path / "step000001-schedule")[0])
    assert trace.get("with_stack") in (1, True)
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])


def test_validation_captured_in_a_window_of_its_own(tmp_path):
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=0, active=2),
                        tensorboard_scalars=False, capture_validation=True, sync_audit=False)
    with prof:
        for i in range(8):
            train_step(model, opt)
            prof.step()
            if i in (1, 5):  # inside the training window (step 2 runs next), then outside it
                prof.pause("validation")
                with torch.no_grad():
                    model(torch.randn(4, 16))
                prof.resume()
    assert captured_steps(tmp_path) == {"step000001-schedule": [1, 2],
                                        "step000006-validation": [6]}
    trace = load_trace(trace_files(tmp_path / "step000006-validation")[0])
    (span,) = [e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#6"]
    inside = [e for e in trace["traceEvents"] if e.get("name") == "aten::linear"
              and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]]
    assert len(inside) == 2 and trace["profcallbacks"]["trigger"] == "validation"


def test_step_is_the_sessions_step_end_and_a_subclass_keeps_its_own(tmp_path):
    """``prof.step`` is bound to the session's ``step_end`` (one call less per step); a subclass
    that defines ``step`` gets its own method, which still counts steps through ``super()``."""
    prof = StepProfiler(tmp_path / "plain", schedule=None, tensorboard_scalars=False)
    assert prof.step == prof.session.step_end
    calls = []

    class Counting(StepProfiler):
        def step(self) -> None:
            calls.append(self.session.step)
            super().step()

    sub = Counting(tmp_path / "sub", schedule=None, tensorboard_scalars=False)
    with prof, sub:
        for _ in range(5):
            prof.step()
            sub.step()
    assert calls == [0, 1, 2, 3, 4]
    assert prof.session.step == sub.session.step == 5
