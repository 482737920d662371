"""DataLoader workers started again for every epoch (``num_workers=2``,
``persistent_workers=False``): each epoch's first batch waits for them, and the findings say
``persistent_workers=True``; with it, the later epochs wait for nothing."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import StepProfiler
from profcallbacks.detect.loaders import restarts_workers, stall_advice
from profcallbacks.findings import DATALOADER_STALL, DATALOADER_WAIT

EPOCHS = 4
WORKER_START_S = 0.3


def slow_worker_start(worker_id: int) -> None:
    time.sleep(WORKER_START_S)  # each worker opens its files, loads an index, a tokenizer...


class Samples(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))


def train(tmp_path, *, persistent: bool) -> tuple[StepProfiler, float]:
    loader = DataLoader(Samples(), batch_size=4, num_workers=2, persistent_workers=persistent,
                        worker_init_fn=slow_worker_start)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, sync_audit=False, memory=None)
    with prof:
        began = time.perf_counter()
        for _ in range(EPOCHS):
            for x in prof.wrap(loader):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                time.sleep(0.005)
                prof.step()
        took_s = time.perf_counter() - began
    return prof, took_s


@pytest.mark.slow
def test_workers_started_again_every_epoch_are_told_to_persist(tmp_path):
    prof, restarting_s = train(tmp_path / "restart", persistent=False)
    waits = [f for f in prof.findings if f.kind == DATALOADER_WAIT]
    assert [f.step for f in waits] == [0, 8, 16, 24]  # each epoch's first step (8 per epoch)
    assert all(f.details["pattern"] == "startup" for f in waits)
    assert [f.details["workers_restarted"] for f in waits] == [False, True, True, True]
    assert all(f.details["data_wait_ms"] >= WORKER_START_S * 1e3 * 0.9 for f in waits)
    assert "at the start of pass 2 over the loader (its 2 workers start again for each pass)" \
        in waits[1].message
    assert all("set persistent_workers=True so workers survive between epochs" in f.message
               for f in waits)
    assert not [f for f in prof.findings if f.kind == DATALOADER_STALL]

    kept, persistent_s = train(tmp_path / "persistent", persistent=True)
    assert [f.step for f in kept.findings if f.kind == DATALOADER_WAIT] == [0]  # start-up once
    assert persistent_s < restarting_s - (EPOCHS - 2) * WORKER_START_S, (persistent_s, restarting_s)


def test_stall_advice_names_persistent_workers_after_several_passes():
    info = {"type": "DataLoader", "num_workers": 2, "persistent_workers": False, "cpus": 4,
            "epoch_ends": True, "prefetch_factor": 2}
    assert restarts_workers(info)
    assert not any("persistent_workers" in a for a in stall_advice(info, bursty=False))
    advice = stall_advice({**info, "passes": 3}, bursty=False)
    assert ("set persistent_workers=True: the workers were started again for each of the 3 "
            "passes over the loader so far, and each pass's first batches wait for them") in advice
    for kept in ({"persistent_workers": True}, {"epoch_ends": False}, {"num_workers": 0}):
        assert not restarts_workers({**info, **kept})
        assert not any("persistent_workers=True:" in a
                       for a in stall_advice({**info, **kept, "passes": 3}, bursty=False))
