"""DeviceStepTimer's bookkeeping and DeviceClock's fallback, with stand-in events (the CUDA part runs
in test_gpu.py)."""

from profcallbacks.core.device_timing import DeviceClock, DeviceStepTimer


class FakeEvent:
    def __init__(self, t_ms: float, done: bool = True) -> None:
        self.t_ms, self.done = t_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other: "FakeEvent") -> float:
        return other.t_ms - self.t_ms


def test_reads_only_completed_events_and_skips_pauses():
    timer = DeviceStepTimer()
    late = FakeEvent(40.0, done=False)
    timer._pending.extend([FakeEvent(0.0), FakeEvent(10.0), FakeEvent(22.0)])
    timer.break_chain()  # a pause: 22 -> 30 is not a step
    timer._pending.extend([FakeEvent(30.0), late])
    assert timer.collect() == [10.0, 12.0]
    assert timer.collect() == []  # the device has not reached `late` yet: nothing waits
    late.done = True
    assert timer.collect() == [10.0]


class BrokenTimer(DeviceStepTimer):
    """A timer whose CUDA calls fail after ``works`` marks (a lost device, a driver error)."""

    def __init__(self, works: int) -> None:
        super().__init__()
        self.marks, self.works = 0, works

    def mark(self) -> None:
        self.marks += 1
        if self.marks > self.works:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self._pending.append(FakeEvent(10.0 * self.marks))


def test_the_device_clock_turns_device_timing_off_at_its_first_failure(caplog):
    timer = BrokenTimer(works=3)
    clock = DeviceClock(iter(range(100)).__next__, timer)
    assert [clock() for _ in range(3)] == [0, 1, 2]  # each read marks the step's event
    assert clock.scalars() == {"device_step_time_ms": 10.0}
    assert clock() == 3  # the mark fails: the host clock goes on, with one warning
    assert clock.timer is None and timer.marks == 4
    assert [clock() for _ in range(3)] == [4, 5, 6]  # no more marks
    assert timer.marks == 4 and clock.scalars() == {}
    warnings = [r for r in caplog.records if "CUDA step timing failed" in r.getMessage()]
    assert len(warnings) == 1 and "illegal memory access" in warnings[0].getMessage()


def test_a_failing_read_turns_device_timing_off_too(caplog):
    class Unreadable(DeviceStepTimer):
        def collect(self) -> list[float]:
            raise RuntimeError("CUDA error: device-side assert triggered")

    clock = DeviceClock(lambda: 1.0, Unreadable())
    assert clock.scalars() == {} and clock.timer is None
    clock.break_chain()  # nothing left to break: no error
    assert sum("CUDA step timing failed" in r.getMessage() for r in caplog.records) == 1
