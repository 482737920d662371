"""Step-slowdown alerts through a ProfilingSession on a fake clock (disabling, logging, on_finding)."""

import logging

from helpers import capture_dirs
from profcallbacks import ProfilerConfig, ProfilingSession, SlowdownConfig
from profcallbacks.core.ranks import RankInfo
from profcallbacks.detect.slowdown import SlowdownDetector
from profcallbacks.run.defaults import default_detectors
from profcallbacks.testing import FakeClock


def test_detector_fault_logs_once_and_disables(tmp_path, caplog):
    """A detector that raises is dropped by the session with one warning; training goes on."""
    from profcallbacks import ProfilerConfig, ProfilingSession, RankInfo

    class Broken:
        calls = 0

        def observe(self, record):
            Broken.calls += 1
            raise ZeroDivisionError("bad maths")

    healthy = SlowdownDetector(SlowdownConfig(warmup_steps=0, baseline_steps=5,
                                              baseline_block_s=0))
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


def test_session_on_a_fake_clock_alerts_logs_and_calls_on_finding(tmp_path, caplog):
    clock, seen = FakeClock(), []
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, watch_capture_file=False,
                            stall=None, sync_audit=False, capture_on_slowdown=False)
    rank = RankInfo()
    session = ProfilingSession(config, tmp_path, rank=rank, clock=clock, on_finding=seen.append,
                               detectors=default_detectors(config, rank))
    session.open()
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        for i in range(2500):
            clock.now += 0.010 * (1.5 if i >= 1500 else 1.0)
            session.step_end()
    session.close()
    assert [f.kind for f in seen] == ["step_slowdown"]
    assert seen[0].details["first_slow_step"] == 1500
    assert seen[0].step == 1500 + 334 - 1  # 5 s of 15 ms steps: 333 are 4.995 s
    assert any("step_slowdown" in r.getMessage() for r in caplog.records)
    assert capture_dirs(tmp_path) == []  # capture_on_slowdown=False
    assert seen[0].details["capture"] is False and "captur" not in seen[0].message
    lines = (tmp_path / "profcallbacks" / "rank0.findings.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"step_slowdown"' in lines[0]
