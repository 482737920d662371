"""The loader-worker verdict's arithmetic, on fixed batch times: which part is largest, how many
workers would keep up, whether this machine has the cores, and the gain (as the step model)."""

from __future__ import annotations

import pytest

from profcallbacks.detect.worker_breakdown import (
    TOO_FEW,
    BatchTimes,
    WorkersBreakdown,
    summarise,
    verdict,
)


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
