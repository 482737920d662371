"""The step hot path: block processing, detector results equal to per-step processing, bounded
memory, and windows whose export runs in a helper process."""

from __future__ import annotations

import gc
import gzip
import json
import os
import random
import signal
import sys
import time
import weakref

import pytest
import torch

from helpers import capture_dirs, tiny_model, train_step
from profcallbacks import ProfilerConfig, ProfilingSession, Schedule, StepProfiler, TraceOptions
from profcallbacks.capture import exporter as export_helper
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import StepRecord
from profcallbacks.run.defaults import default_detectors
from profcallbacks.run.session import BLOCK_S, BLOCK_STEPS
from profcallbacks.testing import FakeClock, StepRecorder


def quiet_config(**options) -> ProfilerConfig:
    return ProfilerConfig(**{"schedule": None, "tensorboard_scalars": False,
                             "watch_capture_file": False, "sync_audit": False,
                             "baseline_capture": False, **options})


def test_detectors_see_steps_once_per_block_and_every_step_in_order(tmp_path):
    clock, recorder = FakeClock(start=1000.0), StepRecorder()
    session = ProfilingSession(quiet_config(), tmp_path, clock=clock, detectors=[recorder])
    session.open()
    clock.now += 0.0001
    session.step_end()  # the first block is one step long: the step rate is not known yet
    assert [r.step for r in recorder.records] == [0]
    recorder.records.clear()
    for i in range(BLOCK_STEPS - 1):
        clock.now += 0.001 * (i + 1)
        session.step_end()
    assert recorder.records == []  # nothing but the buffer until the block ends
    clock.now += 0.5
    session.step_end()
    assert [r.step for r in recorder.records] == list(range(1, BLOCK_STEPS + 1))
    assert [round(r.step_time_s, 9) for r in recorder.records[:3]] == [0.001, 0.002, 0.003]
    assert recorder.records[-1].step_time_s == pytest.approx(0.5)
    took = sum(r.step_time_s for r in recorder.records)
    following = int(BLOCK_S * BLOCK_STEPS / took)  # the next block lasts about BLOCK_S
    assert 1 < following < BLOCK_STEPS
    for _ in range(following):
        assert len(recorder.records) == BLOCK_STEPS
        clock.now += 0.5
        session.step_end()
    assert len(recorder.records) == BLOCK_STEPS + following
    clock.now += 0.5  # 0.5 s steps: blocks of one step
    session.step_end()
    assert len(recorder.records) == BLOCK_STEPS + following + 1
    session.close()


def scenario(seed: int, steps: int) -> list[tuple[float, float]]:
    """(step time, data wait) in seconds: noise, a loader stall episode and a slowdown."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        wait = 0.001 + (0.030 if 300 <= i < 420 and i % 3 == 0 else 0.0)
        compute = 0.010 * (1.8 if i >= 700 else 1.0) * rng.uniform(0.95, 1.05)
        out.append((compute + wait, wait))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detector_results_equal_per_step_processing_on_recorded_sequences(tmp_path, seed):
    steps = scenario(seed, 1000)
    config = quiet_config(capture_on_slowdown=False)
    rank = RankInfo()
    clock = FakeClock(start=1000.0)
    session = ProfilingSession(config, tmp_path, clock=clock, rank=rank,
                               detectors=default_detectors(config, rank))
    session.open()
    for step_time, wait in steps:
        session.data_wait(wait)
        clock.now += step_time
        session.step_end()
    session.close()
    reference = []  # the same records handed to fresh detectors one step at a time
    detectors = default_detectors(config, rank)
    previous = 1000.0
    t = 1000.0
    for i, (step_time, wait) in enumerate(steps):
        t += step_time
        record = StepRecord(i, t - previous, wait, False, i == 0)
        previous = t
        for detector in detectors:
            reference.extend(detector.observe(record))

    def key(findings):
        return [(f.kind, f.step, f.severity, f.message, json.dumps(f.details, sort_keys=True))
                for f in findings]

    assert key(session.findings) == key(reference)
    kinds = {f.kind for f in reference}
    assert {"dataloader_stall", "step_slowdown"} <= kinds  # the scenario finds something


def blocks_now() -> int:
    return sys.getallocatedblocks()


def run_fake_steps(session: ProfilingSession, clock: FakeClock, n: int) -> None:
    step_end = session.step_end
    for i in range(n):
        clock.now += 0.010 + (i % 7) * 1e-4
        step_end()


@pytest.mark.parametrize("log_every", [50, 100_000])  # 100,000: the most allowed
def test_memory_stays_bounded_over_many_steps(tmp_path, log_every):
    """No Python object is retained per step, whatever log_every_n_steps is (issue 17 item 10)."""
    clock = FakeClock(start=1000.0)
    config = quiet_config(log_every_n_steps=log_every)
    session = ProfilingSession(config, tmp_path, clock=clock,
                               detectors=default_detectors(config, RankInfo()))
    session.open()
    run_fake_steps(session, clock, 20_000)  # detectors have filled their windows
    before = blocks_now()
    run_fake_steps(session, clock, 200_000)
    grown = blocks_now() - before
    session.close()
    assert grown < 2_000, f"{grown} blocks retained over 200,000 steps"


@pytest.mark.slow
def test_ten_million_steps_retain_nothing_per_step(tmp_path):
    clock = FakeClock(start=1000.0)
    session = ProfilingSession(quiet_config(stall=None, slowdown=None), tmp_path, clock=clock)
    session.open()
    run_fake_steps(session, clock, 100_000)
    before = blocks_now()
    run_fake_steps(session, clock, 10_000_000)
    grown = blocks_now() - before
    session.close()
    assert grown < 2_000  # bytes per step retained: 0 (a constant, whatever the step count)


def test_export_runs_in_a_helper_process_that_ends_with_the_run(tmp_path):
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=1, active=2),
                        tensorboard_scalars=False)
    with prof:
        for _ in range(6):
            train_step(model, opt)
            prof.step()
        exporter = prof.session._captures._exporter
        process = exporter._channel._process
        assert process is not None and process.pid != os.getpid() and process.poll() is None
    assert process.poll() is not None  # the helper never outlives the run
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
    gc.disable()
    try:
        with prof:
            for _ in range(8):
                train_step(model, opt)
                prof.step()
            retired = prof.session._captures._retired  # the exported window's torch profiler
            events = weakref.ref(retired.profiler)
            del retired
            for _ in range(3):
                train_step(model, opt)
                prof.step()
            assert events() is not None  # training steps never pay for freeing them
            prof.pause()
            assert events() is None  # freed here, with the collector off
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
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=2),
                        tensorboard_scalars=False)
    start = time.monotonic()
    with prof:
        exporter = prof.session._captures._exporter
        exporter._publish_timeout_s = 0.0
        for _ in range(3):
            train_step(model, opt)
            prof.step()
        prof.session._captures.finish(partial=True)
        exporter.close(timeout_s=0.5)  # what close() does, with a wait the test can afford
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


def test_run_statistics_leave_captured_steps_out_and_name_the_slowest_step(tmp_path):
    """Issue 12 item 9: exact percentiles over healthy steps; window steps counted apart."""
    from profcallbacks.layout import steps_file
    from profcallbacks.report.stats import clean_intervals, step_stats

    clock = FakeClock(start=1000.0)
    config = quiet_config(schedule=Schedule(skip_first=100, warmup=1, active=3),
                          log_every_n_steps=40, stall=None, slowdown=None)
    session = ProfilingSession(config, tmp_path, clock=clock)
    session.open()
    for i in range(200):
        if 100 <= i < 104:
            clock.now += 0.500  # the window's steps: slow, and not the job's own
        elif i == 150:
            clock.now += 0.050  # the slowest healthy step
        else:
            clock.now += 0.010 + (i % 10) * 0.001  # 10..19 ms, evenly
        session.step_end()
    session.close()
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    stats = step_stats(clean_intervals(rows))
    # steps 100-103: the window (its export runs in the helper process: later steps count)
    assert stats["steps"] == 200 and stats["steps_excluded"] == 4
    assert stats["max_ms"] == pytest.approx(50.0) and stats["max_step"] == 150
    healthy = sorted([10.0 + i % 10 for i in range(200) if not 100 <= i <= 103 and i != 150]
                     + [50.0])
    assert len(healthy) == 196
    assert stats["median_ms"] == pytest.approx(healthy[97], abs=1e-3)  # nearest rank: 98th
    assert stats["p90_ms"] == pytest.approx(healthy[176], abs=1e-3)  # ceil(176.4) = 177th
    assert stats["p99_ms"] == pytest.approx(healthy[194], abs=1e-3)  # ceil(194.04) = 195th
    assert stats["steps_per_s"] == pytest.approx(196 / sum(healthy) * 1e3, rel=1e-3)
    assert stats["mean_ms"] == pytest.approx(sum(healthy) / 196, rel=1e-3)
    assert "healthy_ms" not in stats["intervals"][0]


def test_lightning_hooks_bypass_the_fetch_timer():
    """Lightning calls profiler.profile() around every hook: that is the wrapped profiler's own."""
    pytest.importorskip("lightning")
    from lightning.pytorch.profilers import SimpleProfiler

    from profcallbacks.lightning_fetch import FETCH_ACTION, FetchTimer

    inner = SimpleProfiler()
    waits: list[float] = []
    timer = FetchTimer(inner, waits.append)
    assert timer.profile == inner.profile  # no frame of ours per hook
    with timer.profile("[Callback]x.on_train_batch_end"):
        pass
    timer.start(f"[_TrainingEpochLoop].{FETCH_ACTION}")
    time.sleep(0.01)
    timer.stop(f"[_TrainingEpochLoop].{FETCH_ACTION}")
    assert len(waits) == 1 and waits[0] >= 0.009
    assert "on_train_batch_end" in inner.summary()  # the wrapped profiler still sees every hook


def test_the_report_marks_a_capture_recorded_during_an_export(tmp_path):
    from profcallbacks.report import build_report, locate_run, render_text

    back_to_back_windows(tmp_path)
    report = build_report(locate_run(tmp_path))
    marks = {c["directory"]: c["export_overlap"] for c in report["captures"]}
    assert marks == {"step000000-schedule": False, "step000001-schedule": True}
    assert "schedule (during an export)" in render_text(report)


@pytest.mark.parametrize(("log_every", "rows"), [(None, [205] * 5), (41, [41] * 25)])
def test_short_steps_are_summarised_every_fifth_of_a_second_unless_told(tmp_path, log_every,
                                                                          rows):
    """~1 ms steps: by default a steps-file row per 0.2 s (205 steps); log_every_n_steps=41
    keeps a row per 41 steps."""
    clock = FakeClock(start=1024.0)
    session = ProfilingSession(quiet_config(log_every_n_steps=log_every, stall=None,
                                            slowdown=None, memory=None), tmp_path, clock=clock)
    session.open()
    for _ in range(1025):
        clock.now += 2.0 ** -10  # 0.98 ms, exact in binary: 204.8 steps per 0.2 s
        session.step_end()
    session.close()
    steps_file = next(tmp_path.rglob("*.steps.jsonl"))
    got = [json.loads(line)["steps"] for line in steps_file.read_text().splitlines()]
    assert got == rows
