"""Step-slowdown alerts: many scripted scenarios on direct step records and a fake clock, plus real
time.sleep loops through StepProfiler that check the capture of the slow steps."""

import logging
import random
import time

import pytest

from helpers import capture_dirs, load_trace, trace_files
from profcallbacks import ProfilerConfig, ProfilingSession, SlowdownConfig, StepProfiler
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.defaults import default_detectors
from profcallbacks.detect.slowdown import SlowdownDetector
from profcallbacks.testing import FakeClock

BASE_S = 0.010
NOISES = {
    "uniform10": lambda r: r.uniform(0.9, 1.1),
    "gauss5": lambda r: max(0.5, r.gauss(1.0, 0.05)),
    "lognorm10": lambda r: r.lognormvariate(0.0, 0.10),
}


def feed(levels, seed=0, noise="uniform10", spike_every=50, config=SlowdownConfig(),
         captured=lambda i: False, after_pause=lambda i: False):
    """Findings of one detector fed ``levels[i] * noise * spikes`` x 10 ms steps."""
    rng = random.Random(seed)
    det = SlowdownDetector(config)
    out = []
    for i, level in enumerate(levels):
        factor = level * NOISES[noise](rng)
        if spike_every and rng.random() < 1 / spike_every:
            factor *= 3.0
        out += det.observe(StepRecord(i, BASE_S * factor, 0.0, captured=captured(i),
                                      after_pause=after_pause(i)))
    return out, det


def of(findings, kind):
    return [f for f in findings if f.kind == kind]


def step_change(size, onset=500, steps=1000):
    return [size if i >= onset else 1.0 for i in range(steps)]


@pytest.mark.parametrize("noise", sorted(NOISES))
@pytest.mark.parametrize("size", [1.25, 1.5, 2.0, 3.0])
def test_sustained_slowdown_is_alerted_once_within_50_steps(size, noise):
    for seed in range(8):
        findings, _ = feed(step_change(size), seed=seed, noise=noise)
        (alert,) = of(findings, "step_slowdown")
        assert 500 <= alert.step < 550, (seed, alert.step)
        assert abs(alert.details["first_slow_step"] - 500) <= 10
        assert alert.details["ratio"] == pytest.approx(size, rel=0.08)
        assert alert.severity == "warning" and not of(findings, "step_speed_recovered")


@pytest.mark.parametrize("noise", sorted(NOISES))
def test_steady_run_with_jitter_and_spikes_never_alerts_in_2000_steps(noise):
    for seed in range(10):
        findings, det = feed([1.0] * 2000, seed=seed, noise=noise)
        assert findings == [], (seed, findings)
        assert det.baseline_s == pytest.approx(BASE_S, rel=0.03)


def test_short_burst_and_slow_captured_or_post_pause_steps_never_alert():
    levels = [2.0 if 500 <= i < 510 else 1.0 for i in range(1000)]
    assert feed(levels)[0] == []
    # every 100 steps: 5 captured steps 4x slower, and 3 slow steps after an eval pause
    levels = [4.0 if i % 100 < 5 else 1.0 for i in range(2000)]
    findings, _ = feed(levels, captured=lambda i: i % 100 < 5, after_pause=lambda i: i % 100 == 5)
    assert findings == []


def test_warmup_steps_stay_out_of_the_baseline():
    """20 warm-up steps at 10x: were they counted, the first 10-step block would set a 10x baseline."""
    det = SlowdownDetector(SlowdownConfig(warmup_steps=20, baseline_steps=10, window=5))
    for i in range(30):
        det.observe(StepRecord(i, BASE_S * (10.0 if i < 20 else 1.0), 0.0))
    assert det.baseline_s == pytest.approx(BASE_S)


def test_gradual_drift_is_reported_once_past_the_threshold():
    levels = [1.0 + i / 10000 for i in range(3000)]  # +1% per 100 steps
    for seed in range(8):
        findings, _ = feed(levels, seed=seed)
        first = of(findings, "step_slowdown")[0]
        assert 1.15 <= levels[first.step] <= 1.23, (seed, first.step)


def test_recovery_note_then_a_new_episode_alerts_again():
    levels = [1.3 if 500 <= i < 600 or 1100 <= i < 1200 else 1.0 for i in range(1500)]
    findings, _ = feed(levels)
    kinds = [(f.kind, f.step) for f in findings]
    assert [k for k, _ in kinds] == ["step_slowdown", "step_speed_recovered"] * 2, kinds
    recovered = findings[1]
    assert recovered.severity == "info" and 600 <= recovered.step < 650
    assert recovered.details["slow_since_step"] == findings[0].step
    # the second alert comes 600 steps after the first: past the cooldown, so it captures too
    assert [f.details["capture"] for f in of(findings, "step_slowdown")] == [True, True]


def test_capture_cooldown_suppresses_captures_of_flapping_slowdowns():
    levels = [2.0 if (i - 500) % 150 < 60 and i >= 500 else 1.0 for i in range(1200)]
    alerts = of(feed(levels, spike_every=0)[0], "step_slowdown")
    assert len(alerts) == 5
    assert [a.details["capture"] for a in alerts] == [True, False, False, False, True]


def test_persistent_slowdown_becomes_the_new_baseline_and_further_slowdowns_alert():
    levels = [1.0] * 500 + [1.5] * 700 + [3.0] * 200
    findings, det = feed(levels, spike_every=0)
    assert [f.kind for f in findings] == ["step_slowdown", "step_baseline_reset", "step_slowdown"]
    reset = findings[1]
    assert reset.step == findings[0].step + 200
    assert reset.details["baseline_step_time_s"] == pytest.approx(1.5 * BASE_S, rel=0.05)
    assert findings[2].details["first_slow_step"] == pytest.approx(1200, abs=3)
    assert findings[2].details["ratio"] == pytest.approx(2.0, rel=0.08)


def test_speed_up_lowers_the_baseline_once_confirmed():
    findings, det = feed([1.0] * 400 + [0.6] * 400, spike_every=0)
    assert findings == [] and det.baseline_s == pytest.approx(0.6 * BASE_S, rel=0.05)
    # the old speed is now a slowdown
    findings, _ = feed([1.0] * 400 + [0.6] * 400 + [1.0] * 100, spike_every=0)
    assert len(of(findings, "step_slowdown")) == 1


def test_scalars_and_finding_details():
    findings, det = feed(step_change(2.0, steps=600), spike_every=0)
    (alert,) = findings
    assert set(alert.details) >= {"first_slow_step", "baseline_step_time_s",
                                  "observed_step_time_s", "ratio", "capture"}
    d = alert.details
    assert d["ratio"] == pytest.approx(d["observed_step_time_s"] / d["baseline_step_time_s"],
                                       rel=1e-3)
    assert "x slower since step 500" in alert.message and "capturing" in alert.message
    assert det.scalars()["slowdown_ratio"] == pytest.approx(2.0, rel=0.08)
    assert SlowdownDetector(SlowdownConfig()).scalars() == {}


def test_detector_fault_logs_once_and_disables(tmp_path, caplog):
    """A detector that raises is dropped by the session with one warning; training goes on."""
    from profcallbacks import ProfilerConfig, ProfilingSession, RankInfo

    class Broken:
        calls = 0

        def observe(self, record):
            Broken.calls += 1
            raise ZeroDivisionError("bad maths")

    healthy = SlowdownDetector(SlowdownConfig(warmup_steps=0, baseline_steps=5))
    session = ProfilingSession(ProfilerConfig(schedule=None, tensorboard_scalars=False,
                                              sync_audit=False), tmp_path, rank=RankInfo(),
                               detectors=[Broken(), healthy])
    with caplog.at_level(logging.WARNING):
        session.open()
        for _ in range(10):
            session.step_end()
        session.close()
    warnings = [r.getMessage() for r in caplog.records if "failed at step" in r.getMessage()]
    assert warnings == ["profcallbacks: Broken failed at step 0 (ZeroDivisionError: bad maths); "
                        "it is disabled for the rest of the run."]
    assert Broken.calls == 1 and healthy._seen == 9  # the others go on (first step: after start)


@pytest.mark.parametrize("kwargs, match", [
    ({"threshold": 1.0}, "threshold=1.0"),
    ({"threshold": 1.3, "recover_threshold": 1.3}, "recover_threshold=1.3"),
    ({"spike_cap": 1.1}, "spike_cap=1.1"),
    ({"window": 0}, "window=0"),
    ({"patience": True}, "patience=True"),
    ({"rebaseline_after_steps": 0}, "rebaseline_after_steps=0"),
])
def test_config_errors_name_the_parameter_and_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        SlowdownConfig(**kwargs)
    assert "Use e.g." in str(info.value)



def test_session_on_a_fake_clock_alerts_logs_and_calls_on_finding(tmp_path, caplog):
    clock, seen = FakeClock(), []
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, watch_capture_file=False,
                            stall=None, sync_audit=False, capture_on_slowdown=False)
    rank = RankInfo()
    session = ProfilingSession(config, tmp_path, rank=rank, clock=clock, on_finding=seen.append,
                               detectors=default_detectors(config, rank))
    session.open()
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        for i in range(400):
            clock.now += BASE_S * (1.5 if i >= 300 else 1.0)
            session.step_end()
    session.close()
    assert [f.kind for f in seen] == ["step_slowdown"]
    assert 300 <= seen[0].step < 350 and seen[0].details["first_slow_step"] == 300
    assert any("step_slowdown" in r.getMessage() for r in caplog.records)
    assert capture_dirs(tmp_path) == []  # capture_on_slowdown=False
    assert seen[0].details["capture"] is False and "captur" not in seen[0].message
    lines = (tmp_path / "profcallbacks" / "rank0.findings.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"step_slowdown"' in lines[0]


def tensorboard_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_real_sleep_loop_captures_the_slow_steps_as_stepN_slowdown(tmp_path):
    """Default settings, 2 ms steps that become 6 ms: one alert, one capture of slow steps."""
    prof = StepProfiler(tmp_path, schedule=None, watch_capture_file=False, stall=None,
                        sync_audit=False, log_every_n_steps=25)
    onset = 150
    with prof:
        for i in range(215):
            time.sleep(0.006 if i >= onset else 0.002)
            prof.step()
    (alert,) = of(prof.findings, "step_slowdown")
    assert onset - 15 <= alert.details["first_slow_step"] <= onset + 5  # a loaded CI box is noisy
    assert alert.step < onset + 50 and alert.details["ratio"] > 2.0
    (capture,) = capture_dirs(tmp_path)
    first_active = alert.step + 2  # requested during step alert+1; one warm-up step
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


class SlowingDataset:
    """1 ms per sample for the first ``slow_after`` samples loaded (in any order), then 15 ms."""

    def __init__(self, slow_after: int) -> None:
        self.slow_after = slow_after
        self.loaded = 0

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i):
        import torch

        self.loaded += 1
        time.sleep(0.015 if self.loaded > self.slow_after else 0.001)
        return {"x": torch.randn(4)}


@pytest.mark.parametrize("front_end", ["plain", "lightning", "hf"])
def test_same_slowdown_alert_and_capture_through_every_front_end(tmp_path, front_end):
    """The contract scenario (20 ms steps) gets ~2.3x slower at step 50 through its loader."""
    from front_ends import FRONT_ENDS
    from profcallbacks import Schedule

    options = dict(schedule=Schedule(skip_first=1000), tensorboard_scalars=False, stall=None,
                   watch_capture_file=False, sync_audit=False, capture_steps=2,
                   slowdown=SlowdownConfig(warmup_steps=5, baseline_steps=30, window=20))
    findings = FRONT_ENDS[front_end](tmp_path, SlowingDataset(slow_after=100), 85, options)
    (alert,) = of(findings, "step_slowdown")
    # the HF Trainer fetches one batch ahead, so its first slow step may come one step early
    assert 46 <= alert.details["first_slow_step"] <= 52 and alert.step < 75, alert
    assert alert.details["ratio"] > 1.8
    (capture,) = capture_dirs(tmp_path)
    assert capture.name.endswith("-slowdown") and trace_files(capture)
