"""ProfilingSession.batch_arrived()/batch_done(): data wait measured by the core from its clock."""

from profcallbacks import ProfilerConfig, ProfilingSession
from profcallbacks.testing import FakeClock, StepRecorder


def test_data_wait_covers_every_micro_batch_and_restarts_after_resume(tmp_path):
    clock, recorder = FakeClock(start=100.0), StepRecorder()
    session = ProfilingSession(ProfilerConfig(schedule=None, tensorboard_scalars=False), tmp_path,
                               clock=clock, detectors=[recorder])
    session.open()
    for _ in range(3):  # one step of three micro-batches: 2 s wait, 1 s compute each
        clock.now += 2.0
        session.batch_arrived()
        clock.now += 1.0
        session.batch_done()
    session.step_end()
    session.pause()
    clock.now += 50.0  # validation: neither wait nor step time
    session.resume()
    clock.now += 0.5
    session.batch_arrived()
    clock.now += 1.0
    session.step_end()
    session.close()
    first, second = recorder.records
    assert (first.step_time_s, first.data_wait_s) == (9.0, 6.0)
    assert (second.step_time_s, second.data_wait_s) == (1.5, 0.5)
    assert second.after_pause


def test_restore_counts_earlier_captures_towards_max_captures(tmp_path):
    from profcallbacks import Schedule

    config = ProfilerConfig(schedule=Schedule(skip_first=0, warmup=0, active=1, repeat=0),
                            max_captures=3, tensorboard_scalars=False)
    session = ProfilingSession(config, tmp_path, start_step=10)
    session.restore(captures_started=2)
    session.open()
    for _ in range(4):
        session.step_end()
    session.close()
    assert session.captures_started == 3
    assert [p.name for p in session.captures] == ["step000010-schedule"]
