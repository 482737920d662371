"""The loader-worker verdict's arithmetic, on fixed batch times: which part is largest, how many
workers would keep up, whether this machine has the cores, and the gain (as the step model)."""

from __future__ import annotations

import time

import pytest
import torch

from profcallbacks.detect.worker_breakdown import (
    TOO_FEW,
    BatchTimes,
    WorkersBreakdown,
    summarise,
    verdict,
)


class Batch:
    """A batch type with its own ``pin_memory()`` (torch calls it to pin custom batches)."""

    def __init__(self) -> None:
        self.took = 0.0

    def pin_memory(self) -> Batch:
        start = time.perf_counter()
        torch.ones(200_000).cumsum(0)
        self.took = time.perf_counter() - start
        return self


def _batches(fetch_s: float, collate_s: float, send_s: float, n: int = 8) -> list[BatchTimes]:
    out = []
    for i in range(n):
        t = 100.0 + i
        out.append(BatchTimes(1, 0, i, i % 2, t, t + fetch_s, t + fetch_s + collate_s,
                              t + fetch_s + collate_s, t + fetch_s + collate_s,
                              t + fetch_s + collate_s + send_s))
    return out


def _summary(fetch_s: float, collate_s: float, send_s: float) -> WorkersBreakdown:
    waits = {(1, 0, i): (100.0 + i, 100.0 + i + 0.001, i) for i in range(8)}  # one batch a step
    found = summarise(_batches(fetch_s, collate_s, send_s), waits, workers=2)
    assert found is not None
    return found


@pytest.mark.parametrize(("times", "part"), [((0.040, 0.002, 0.001), "fetch"),
                                             ((0.002, 0.030, 0.001), "collate"),
                                             ((0.001, 0.002, 0.050), "transfer")])
def test_the_largest_part_is_named(times: tuple[float, float, float], part: str) -> None:
    found = _summary(*times)
    assert found.largest == part
    assert [r.worker for r in found.rows] == [0, 1] and all(r.batches == 4 for r in found.rows)
    assert found.batches_per_step == 1.0


def test_too_few_workers_when_the_cores_allow_more() -> None:
    found = _summary(0.040, 0.002, 0.001)  # 43 ms a batch per worker: 2 build 46.5/s
    info = {"num_workers": 2, "cpus": 8, "collate_fn": "default_collate"}
    v = verdict(found, wait_ms=18.0, step_ms=28.0, info=info)  # 10 ms a step without the wait
    # 1.2 x 43 ms / 10 ms: 6 workers keep up with 20% to spare; 8 cores allow them
    assert v.details["workers_needed"] == 6 and v.details["bottleneck"] == TOO_FEW
    assert v.fix[0].startswith("num_workers=6")
    # with 6 workers a batch is ready every 7.2 ms, within the 10 ms rest: the whole wait goes
    assert v.gain_ms == pytest.approx(18.0)
    assert v.details["consume_per_s"] == pytest.approx(100.0)
    assert v.details["build_per_s"] == pytest.approx(2 * 1000 / 43.0, rel=1e-3)


def test_the_part_fix_when_the_cores_do_not_allow_more_workers() -> None:
    found = _summary(0.040, 0.002, 0.001)
    v = verdict(found, wait_ms=18.0, step_ms=28.0, info={"num_workers": 2, "cpus": 2})
    assert v.details["bottleneck"] == "fetch" and v.part == "fetch"
    assert v.fix[0].startswith("make the dataset's fetch cheaper")
    assert "more than the 2 this process's 2 cores allow" in v.text
    # without the fetch a batch takes 3 ms: ready every 1.5 ms with 2 workers, within the rest
    assert v.gain_ms == pytest.approx(18.0)


def test_the_gain_leaves_what_the_rest_of_the_step_does_not_hide() -> None:
    found = _summary(0.010, 0.060, 0.002)  # collate 60 of 72 ms
    v = verdict(found, wait_ms=30.0, step_ms=36.0, info={"num_workers": 2, "cpus": 2})
    # without collate a batch takes 12 ms: every 6 ms with 2 workers, the rest is 6 ms: all saved
    assert v.part == "collate" and v.gain_ms == pytest.approx(30.0)
    v = verdict(found, wait_ms=33.0, step_ms=36.0, info={"num_workers": 2, "cpus": 2})
    # the rest is 3 ms: 6 - 3 = 3 ms of each wait is left
    assert v.gain_ms == pytest.approx(30.0)


def test_no_whole_batch_no_breakdown() -> None:
    half = [b._replace(send1=0.0) for b in _batches(0.01, 0.01, 0.01)]
    assert summarise(half, {}, workers=2) is None


def test_pinning_is_its_own_part_and_leaves_the_transfer() -> None:
    fetch, collate, send = 0.004, 0.001, 0.001
    sent = 100.0 + fetch + collate + send  # each batch i is sent at sent + i
    # the loop waits 30 ms after the send; the pin thread pinned the batch for 25 ms of it
    waits = {(1, 0, i): (100.0 + i, sent + i + 0.030, i) for i in range(8)}
    pins = {(1, 0, i): (sent + i + 0.002, sent + i + 0.027) for i in range(8)}
    without = summarise(_batches(fetch, collate, send), waits, workers=2)
    found = summarise(_batches(fetch, collate, send), waits, workers=2, pins=pins)
    assert without is not None and found is not None
    assert "pin" not in without.parts_ms and without.largest == "transfer"
    assert without.parts_ms["transfer"] == pytest.approx(31.0)  # send 1 + 30 in the main process
    assert found.parts_ms["pin"] == pytest.approx(25.0) and found.largest == "pin"
    assert found.parts_ms["transfer"] == pytest.approx(6.0)  # 31 less the 25 of pinning
    assert all(r.pin_ms == pytest.approx(25.0) for r in found.rows)
    assert found.batch_ms == pytest.approx(6.0)  # the workers' own time: pinning is not theirs
    v = verdict(found, wait_ms=30.0, step_ms=36.0, info={"num_workers": 2, "cpus": 2})
    assert v.part == "pin" and "pin" in v.fix[0] and v.details["workers"]["rows"][0]["pin_ms"] == 25.0


def test_the_pin_threads_time_is_noted_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own pin-memory loop, on a thread, between real queues: each batch's pinning
    (a batch type's ``pin_memory()``, as torch calls it) is noted with its index, and lasts at
    least what the batch measured of its own pinning."""
    import multiprocessing
    import queue
    import threading

    from torch.utils.data._utils.pin_memory import _pin_memory_loop

    from profcallbacks.detect.worker_pin import time_queues

    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)  # CPU build
    source, sink = multiprocessing.get_context("spawn").Queue(), queue.Queue()
    noted: dict[int, tuple[float, float]] = {}
    time_queues(source, sink, lambda idx, start, end: noted.__setitem__(idx, (start, end)))
    done = threading.Event()
    thread = threading.Thread(target=_pin_memory_loop, args=(source, sink, 0, done, "cpu"))
    thread.start()
    try:
        for i in range(4):
            source.put((i, Batch()))
        out = [sink.get(timeout=30) for _ in range(4)]
    finally:
        done.set()
        thread.join()
    assert sorted(noted) == [0, 1, 2, 3] and [idx for idx, _ in out] == [0, 1, 2, 3]
    for idx, batch in out:
        start, end = noted[idx]
        assert end - start >= batch.took > 0
