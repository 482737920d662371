"""Step-slowdown alerts on a real time.sleep loop through StepProfiler: the capture of the slow steps."""

import itertools
import time
from statistics import median

from helpers import capture_dirs, load_trace, trace_files
from profcallbacks import SlowdownConfig, StepProfiler
from profcallbacks.findings import (
    STEP_BASELINE_RESET,
    STEP_SLOWDOWN,
    STEP_SPEED_RECOVERED,
    Finding,
)
from profcallbacks.run.blocks import BLOCK_STEPS


def tensorboard_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


GUARD_S = 300.0  # only against a hang: the run waits on what the profiler shows, not on time
SLOWER = 3.0
"""A slow step takes this many times the median step measured just before the change."""
CALM = 31
"""The change comes after this many steps in a row at the baseline's pace (under 1.5x): a slow
stretch of the machine's own just before it would be taken for the change's start."""
SLOW_STEPS = 120
"""Slow steps at least (and until their capture is published): summaries of them follow."""


def test_real_sleep_loop_captures_the_slow_steps_as_stepN_slowdown(tmp_path):
    """2 ms steps that become 3x the run's own measured step: one alert after 0.3 s, one capture
    of slow steps.

    A busy machine stretches 2 ms sleeps by itself, for stretches of steps: the change comes
    once the detector has its baseline, the baseline capture is published, no slowdown the
    detector alerted (the machine's) goes on and the last 30 steps kept the baseline's pace;
    the slow steps are sized on those steps."""
    alerted = [False]

    def follow(finding: Finding) -> None:
        if finding.kind == STEP_SLOWDOWN:
            alerted[0] = True
        elif finding.kind in (STEP_SPEED_RECOVERED, STEP_BASELINE_RESET):
            alerted[0] = False

    baseline_ms: list[float] = []  # the detector's baseline, once it has one

    def sink(values: dict[str, float], step: int) -> None:
        if "profcallbacks/baseline_step_time_ms" in values:
            baseline_ms.append(values["profcallbacks/baseline_step_time_ms"])

    prof = StepProfiler(tmp_path, schedule=None, watch_capture_file=False, stall=None,
                        sync_audit=False, log_every_n_steps=25, on_finding=follow,
                        metrics_sink=sink,
                        slowdown=SlowdownConfig(baseline_block_s=0.1, min_duration_s=0.3))
    onset, slow_s, ends = None, 0.0, []
    deadline = time.monotonic() + GUARD_S
    with prof:
        for i in itertools.count():
            assert time.monotonic() < deadline, (onset, [f.kind for f in prof.findings])
            ends.append(time.perf_counter())
            recent = [b - a for a, b in zip(ends[-CALM:], ends[-CALM + 1:], strict=False)]
            if onset is None and baseline_ms and not alerted[0] and len(recent) == CALM - 1 and max(
                    recent) < 1.5 * baseline_ms[-1] / 1e3 and any(
                    c.name.endswith("-baseline") for c in prof.captures):
                onset = i
                slow_s = SLOWER * median(recent)
            time.sleep(slow_s if onset is not None else 0.002)
            prof.step()
            if onset is not None and i >= onset + SLOW_STEPS and any(
                    c.name.endswith("-slowdown") and int(c.name[4:10]) > onset
                    for c in prof.captures):
                break
    alerts = [f for f in prof.findings if f.kind == "step_slowdown"]
    after = [f for f in alerts if f.step >= onset]  # those before it: the machine's own
    assert after, (onset, [f.message for f in alerts])
    alert = after[0]  # the change's (later ones: the machine slowing the slow steps further)
    assert onset - 15 <= alert.details["first_slow_step"] <= onset + 5
    assert alert.step < onset + 70 and alert.details["ratio"] > 2.0
    assert alert.details["slow_duration_s"] >= 0.3
    baseline, *later = capture_dirs(tmp_path)  # the automatic baseline, then the slow steps
    assert baseline.name.endswith("-baseline"), baseline
    capture = next(c for c in later if c.name.endswith("-slowdown") and int(c.name[4:10]) > onset)
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
    assert all(d >= slow_s * 1e6 * 5 / 6 for d in steps.values()), (steps, slow_s)  # the slow ones
    scalars = tensorboard_scalars(tmp_path)
    # the ratio reaches TensorBoard and rises with the change; before it, the ratio is the
    # machine's (1.0 on a steady run: tests/test_watch.py holds that on a scripted run)
    ratios = scalars["profcallbacks/slowdown_ratio"]
    before = [v for step, v in ratios if step < onset]
    assert before and max(v for step, v in ratios if step >= onset) > 1.5 * before[-1], ratios
