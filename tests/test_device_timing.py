"""DeviceStepTimer's bookkeeping, with stand-in events (the CUDA part runs in test_gpu.py)."""

from profcallbacks.core.device_timing import DeviceStepTimer


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
