import pytest
import torch

from profcallbacks import Phase, Schedule
from profcallbacks.capture.planner import CapturePlanner


def torch_active_steps(skip_first, wait, warmup, active, repeat, n):
    fn = torch.profiler.schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active,
                                 repeat=repeat)
    record = {torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE}
    return [s for s in range(n) if fn(s) in record]


def test_issue_example():
    s = Schedule(skip_first=3, wait=2, warmup=1, active=4, repeat=2)
    assert [i for i in range(40) if s.phase(i) is Phase.ACTIVE] == [6, 7, 8, 9, 13, 14, 15, 16]


@pytest.mark.parametrize("args", [(0, 0, 1, 1, 1), (3, 2, 1, 4, 2), (5, 1, 0, 3, 3), (0, 3, 2, 2, 4),
                                  (10, 0, 1, 3, 1), (2, 5, 2, 1, 0)])
def test_same_steps_as_torch_schedule(args):
    s = Schedule(**dict(zip(("skip_first", "wait", "warmup", "active", "repeat"), args, strict=True)))
    ours = [i for i in range(200) if s.phase(i) is Phase.ACTIVE]
    assert ours == torch_active_steps(*args, 200)


def test_options_are_keyword_only():
    """``Schedule(3)`` read as ``skip_first=3`` silently; every option is named instead."""
    from profcallbacks import ByteBudget, MemoryConfig, ProfilerConfig, SlowdownConfig, StallConfig

    for config in (Schedule, StallConfig, SlowdownConfig, MemoryConfig, ByteBudget, ProfilerConfig):
        with pytest.raises(TypeError, match="positional argument"):
            config(3)


@pytest.mark.parametrize("kwargs, name", [({"skip_first": -1}, "skip_first"), ({"wait": -2}, "wait"),
                                           ({"warmup": -1}, "warmup"), ({"active": 0}, "active"),
                                           ({"repeat": -1}, "repeat")])
def test_invalid_values_name_parameter_and_value(kwargs, name):
    with pytest.raises(ValueError, match=rf"{name}={list(kwargs.values())[0]}.*at least"):
        Schedule(**kwargs)


def test_non_int_rejected():
    with pytest.raises(ValueError, match=r"Schedule\(active=2.5\): active must be an int"):
        Schedule(active=2.5)


def test_default_repeat_is_finite():
    s = Schedule()
    assert s.repeat >= 1
    assert not any(s.phase(i) is not Phase.IDLE for i in range(1000, 2000))


def test_next_window_start():
    s = Schedule(skip_first=3, wait=2, warmup=1, active=4, repeat=2)
    assert s.next_window_start(0) == 5
    assert s.next_window_start(5) == 5
    assert s.next_window_start(6) == 12
    assert s.next_window_start(13) is None


def phases(planner, n):
    return [planner.phase_for(i).value[0] for i in range(n)]


def test_planner_follows_schedule():
    p = CapturePlanner(Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2), max_captures=9)
    assert "".join(phases(p, 12)) == "iiiwaaiwaaii"


def test_planner_request_starts_next_step_and_schedule_resumes():
    p = CapturePlanner(Schedule(skip_first=10, warmup=1, active=2), max_captures=9)
    assert p.phase_for(0) is Phase.IDLE
    p.request(3, "manual")
    assert [p.phase_for(i).value[0] for i in range(1, 14)] == list("waaaiiiiiwaai")
    assert p.captures_started == 2


def test_planner_max_captures_bounds_repeat_forever():
    p = CapturePlanner(Schedule(skip_first=0, wait=0, warmup=0, active=1, repeat=0), max_captures=3)
    assert sum(p.phase_for(i) is Phase.ACTIVE for i in range(100)) == 3


def test_planner_joins_scheduled_window_midway():
    p = CapturePlanner(Schedule(skip_first=10, warmup=1, active=4), max_captures=9)
    assert p.phase_for(12) is Phase.ACTIVE
    assert p.window is not None and (p.window.first_active, p.window.last_step) == (12, 14)
