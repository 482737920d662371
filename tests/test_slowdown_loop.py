"""Step-slowdown alerts on a real time.sleep loop through StepProfiler: the capture of the slow steps."""

import time

import pytest

from helpers import capture_dirs, load_trace, trace_files
from profcallbacks import SlowdownConfig, StepProfiler
from profcallbacks.run.blocks import BLOCK_STEPS


def tensorboard_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_real_sleep_loop_captures_the_slow_steps_as_stepN_slowdown(tmp_path):
    """2 ms steps that become 6 ms: one alert after 0.3 s, one capture of slow steps."""
    prof = StepProfiler(tmp_path, schedule=None, watch_capture_file=False, stall=None,
                        sync_audit=False, log_every_n_steps=25,
                        slowdown=SlowdownConfig(baseline_block_s=0.1, min_duration_s=0.3))
    onset = 250
    with prof:
        for i in range(onset + 120):
            time.sleep(0.006 if i >= onset else 0.002)
            prof.step()
    (alert,) = [f for f in prof.findings if f.kind == "step_slowdown"]
    assert onset - 15 <= alert.details["first_slow_step"] <= onset + 5  # a loaded CI box is noisy
    assert alert.step < onset + 70 and alert.details["ratio"] > 2.0
    assert alert.details["slow_duration_s"] >= 0.3
    baseline, capture = capture_dirs(tmp_path)  # the automatic baseline, then the slow steps
    assert baseline.name.endswith("-baseline"), baseline
    # requested at the end of the block holding the alert step (at most BLOCK_STEPS or BLOCK_S
    # later: the run goes on long enough for that); one warm-up step
    first_active = int(capture.name[4:10])
    assert alert.step + 2 <= first_active <= alert.step + 1 + BLOCK_STEPS
    assert capture.name == f"step{first_active:06d}-slowdown"
    trace = load_trace(trace_files(capture)[0])
    steps = {e["name"]: e["dur"] for e in trace["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#")}
    slow_steps = sorted(int(n.split("#")[1]) for n in steps)
    assert slow_steps == list(range(first_active, first_active + 3))
    assert all(d >= 5000 for d in steps.values()), steps  # microseconds: the slow 6 ms steps
    scalars = tensorboard_scalars(tmp_path)
    ratios = [v for _, v in scalars["profcallbacks/slowdown_ratio"]]
    assert ratios[0] == pytest.approx(1.0, abs=0.3) and max(ratios) > 1.5
