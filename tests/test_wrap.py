"""``StepProfiler.wrap``: the items of the iterable, each fetch timed, with the iterable's ``len()``."""

import time
from collections.abc import Iterable, Iterator

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import StepProfiler
from profcallbacks.testing import StepRecorder


class SlowSquares(Dataset):
    """Twelve items, each taking ``delay_s`` to load."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        return torch.tensor([float(i * i)])


def profiler(tmp_path) -> tuple[StepProfiler, StepRecorder]:
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, sync_audit=False,
                        memory=None, slowdown=None, stall=None)
    recorder = StepRecorder()
    prof.session.add_detector(recorder)
    return prof, recorder


def log_every(iterable: Iterable, print_freq: int, lines: list[str]) -> Iterator:
    """torchvision references' ``MetricLogger.log_every``, as written there (printing aside)."""
    i = 0
    space_fmt = ":" + str(len(str(len(iterable)))) + "d"  # type: ignore[arg-type]
    end = time.time()
    for obj in iterable:
        yield obj
        if i % print_freq == 0 or i == len(iterable) - 1:  # type: ignore[arg-type]
            lines.append(("[{0" + space_fmt + "}/{1}]").format(i, len(iterable)))  # type: ignore[arg-type]
        i += 1
        end = time.time()
    del end


@pytest.mark.parametrize("source", [DataLoader(SlowSquares(0.0), batch_size=5), list(range(7)),
                                    range(3), {"a": 1, "b": 2}])
def test_the_wrap_has_the_len_of_what_it_wraps(tmp_path, source):
    prof, _ = profiler(tmp_path)
    with prof:
        wrapped = prof.wrap(source)
        assert len(wrapped) == len(source)
        assert len(list(wrapped)) == len(source)


def test_a_wrap_of_an_iterable_without_len_has_none(tmp_path):
    prof, _ = profiler(tmp_path)
    with prof:
        wrapped = prof.wrap(iter([1, 2]))
        with pytest.raises(TypeError):
            len(wrapped)
        assert not hasattr(wrapped, "__len__")
        assert list(wrapped) == [1, 2]


def test_the_wrap_iterates_once_like_before(tmp_path):
    prof, recorder = profiler(tmp_path)
    with prof:
        wrapped = prof.wrap([10, 20, 30])
        assert iter(wrapped) is wrapped and next(wrapped) == 10
        for _ in wrapped:
            prof.step()
        assert list(wrapped) == []  # one pass, as a generator
    assert len(recorder.records) == 2


def test_metric_logger_log_every_over_the_wrapped_loader_times_each_fetch(tmp_path):
    loader = DataLoader(SlowSquares(0.004), batch_size=2)
    prof, recorder = profiler(tmp_path)
    lines: list[str] = []
    seen = []
    with prof:
        for batch in log_every(prof.wrap(loader), 2, lines):
            seen.append(batch)
            prof.step()
    assert len(seen) == len(loader) == 6
    assert lines == ["[0/6]", "[2/6]", "[4/6]", "[5/6]"]
    assert len(recorder.records) == 6
    # two 4 ms items per batch: each step's data wait is the fetch, not the logger's printing
    assert all(r.data_wait_s >= 0.0075 for r in recorder.records), [r.data_wait_s for r in recorder.records]
