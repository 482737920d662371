"""DataLoader workers started again for every epoch (``num_workers=2``,
``persistent_workers=False``): each epoch's first batch waits for them, and the findings say
``persistent_workers=True``; with it, the later epochs wait for nothing."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import StallConfig, StepProfiler
from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.loaders import describe_loader, restarts_workers, stall_advice
from profcallbacks.detect.stall import StallDetector
from profcallbacks.findings import DATALOADER_STALL, DATALOADER_WAIT

EPOCHS = 4
WORKER_START_S = 0.3
# a busy machine adds hiccups of its own (isolated waits): reported too, never in place of these
OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, watch_capture_file=False,
               sync_audit=False, memory=None, stall=StallConfig(max_isolated_reports=100))


def start_up_waits(findings: list) -> list:
    return [f for f in findings if f.kind == DATALOADER_WAIT and f.details["pattern"] == "startup"]


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
    prof = StepProfiler(tmp_path, **OPTIONS)
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
    waits = start_up_waits(prof.findings)
    assert [f.step for f in waits] == [0, 8, 16, 24]  # each epoch's first step (8 per epoch)
    assert not [f for f in prof.findings if f.kind == DATALOADER_WAIT and f.step % 8 == 1]
    assert [f.details["workers_restarted"] for f in waits] == [False, True, True, True]
    assert all(f.details["data_wait_ms"] >= WORKER_START_S * 1e3 * 0.9 for f in waits)
    assert "at the start of pass 2 over the loader (its 2 workers start again for each pass)" \
        in waits[1].message
    assert all("set persistent_workers=True so workers survive between epochs" in f.message
               for f in waits)
    # the start-up waits are no stall's: a stall here is the machine's (beside two CPU burners the
    # workers' sends took 5 ms a batch, 2.8 ms of a 9.2 ms step over the whole run), its wait per
    # step below one start-up's spread over its steps; on fixed times, no stall at all:
    # test_restarts_every_pass_are_start_up_waits_not_a_stall
    startup_ms = min(f.details["data_wait_ms"] for f in waits)
    for stall in [f for f in prof.findings if f.kind == DATALOADER_STALL]:
        steps = stall.details["last_step"] - stall.details["first_step"] + 1
        assert stall.details["data_wait_ms_per_step"] < startup_ms / steps, stall.message

    kept, persistent_s = train(tmp_path / "persistent", persistent=True)
    assert [f.step for f in start_up_waits(kept.findings)] == [0]  # start-up once
    # 1.8 s -> 0.6 s on an idle machine (3 start-ups of 0.3 s saved); at least one on a busy one
    assert restarting_s - persistent_s >= WORKER_START_S, (persistent_s, restarting_s)


def test_each_workers_first_batch_belongs_to_the_start_up_wait():
    """With 2 workers, the second batch of a pass may wait for the second worker's start-up
    too (started a little later on a busy machine): one start-up note, no isolated wait."""
    detector = StallDetector(StallConfig())
    detector.set_loader(describe_loader(DataLoader(range(8), num_workers=2)))
    records = [StepRecord(i, 0.01, 0.0, after_pause=i == 0) for i in range(40)]  # a reference
    records += [StepRecord(40, 0.35, 0.3, after_pause=True), StepRecord(41, 0.25, 0.2)]  # a pass
    records += [StepRecord(i, 0.01, 0.0) for i in range(42, 80)] + [StepRecord(80, 0.25, 0.2)]
    found = [f for r in records for f in detector.observe(r)]
    assert [(f.step, f.details["pattern"]) for f in found] == [(40, "startup"), (80, "isolated")]


def test_restarts_every_pass_are_start_up_waits_not_a_stall():
    """Four passes of 8 steps whose workers start again each pass (0.3 s, then 0.2 s for the
    second worker's first batch), no wait in between: four start-up notes, no stall."""
    detector = StallDetector(StallConfig(max_isolated_reports=100))
    detector.set_loader(describe_loader(DataLoader(range(8), num_workers=2)))
    records = []
    for first in range(0, 32, 8):
        records += [StepRecord(first, 0.31, 0.3, after_pause=True), StepRecord(first + 1, 0.21, 0.2)]
        records += [StepRecord(i, 0.009, 0.0005) for i in range(first + 2, first + 8)]
    found = [f for r in records for f in detector.observe(r)]
    detector.close(failed=False)  # a stall holding at the end of a short run is reported here
    found += detector.take_findings()
    assert [(f.kind, f.step, f.details.get("pattern")) for f in found] == [
        (DATALOADER_WAIT, step, "startup") for step in (0, 8, 16, 24)]


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


class LazyOpen(Dataset[dict[str, torch.Tensor]]):
    """``size`` samples of ``load_s`` each; a worker process opens its data on its first sample
    (``WORKER_START_S``)."""

    def __init__(self, size: int = 8, load_s: float = 0.0) -> None:
        self.size, self.load_s = size, load_s
        self._opened_in: int | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self._opened_in != os.getpid():
            time.sleep(WORKER_START_S)
            self._opened_in = os.getpid()
        if self.load_s:
            time.sleep(self.load_s)
        return {"x": torch.full((4,), float(i))}


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.linear(x).square().mean()}




@pytest.mark.slow
def test_hf_epochs_that_start_workers_again_are_told_to_persist(tmp_path):
    """3 epochs of 4 steps through the HF Trainer (which does not pause between epochs: its
    callback tells the session of each epoch's pass): each epoch's first wait names the restart."""
    transformers = pytest.importorskip("transformers")
    from profcallbacks.hf import ProfilerCallback

    callback = ProfilerCallback(tmp_path, **OPTIONS)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=3, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=2, remove_unused_columns=False, disable_tqdm=True)
    transformers.Trainer(model=Regression(), args=args, train_dataset=LazyOpen(),
                         callbacks=[callback]).train()
    waits = start_up_waits(callback.findings)  # a busy machine may add isolated waits elsewhere
    assert [f.step for f in waits] == [0, 4, 8], [(f.step, f.message) for f in callback.findings]
    assert [f.details["workers_restarted"] for f in waits] == [False, True, True]
    assert all(f.details["data_wait_ms"] >= WORKER_START_S * 1e3 * 0.9 for f in waits)
    assert all("set persistent_workers=True" in f.message for f in waits)


@pytest.mark.slow
def test_lightning_counts_its_epochs_passes_for_the_stall_advice(tmp_path):
    """Lightning fetches an epoch's first batch in its epoch set-up (no step: the workers'
    start-up is not seen as a wait there), but its callback counts the passes: the stall of a
    slow loader over 4 epochs (a run too short for the hold, reported at its end) names them."""
    pl = pytest.importorskip("lightning.pytorch")
    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Regression()

        def training_step(self, batch, batch_idx):
            return self.net(batch["x"])["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = ProfilerCallback(tmp_path, **OPTIONS)
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", logger=False, callbacks=[callback],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(Module(), DataLoader(LazyOpen(16, 0.03), batch_size=2, num_workers=2))
    (stall,) = [f for f in callback.findings if f.kind == DATALOADER_STALL]
    assert stall.details["loader"]["passes"] == 4, stall.message
    assert any(a.startswith("set persistent_workers=True: the workers were started again for "
                            "each of the 4 passes") for a in stall.details["advice"]), stall.message


@pytest.mark.parametrize("in_blocks", [False, True], ids=["step-by-step", "blocks"])
def test_later_workers_first_batches_are_start_up_time_not_stall_time(in_blocks):
    """Six passes of 5 steps of 10 ms, 2 workers started for each: a pass's first batch waits
    0.3 s, its second 0.1 s (the second worker, started later on a busy machine). Both are the
    start-up's: start-up notes, and no stall, also at the run's end (counted, the second
    batches would be 74% of every block of 4 steps)."""
    detector = StallDetector(StallConfig(max_isolated_reports=100))
    detector.set_loader(describe_loader(DataLoader(range(8), num_workers=2)))
    found = []
    for first in range(0, 30, 5):
        times = [0.31, 0.11] + [0.01] * 3
        waits = [0.3, 0.1] + [0.001] * 3
        if in_blocks:
            found += detector.observe_block(first, times, waits, False, True)
        else:
            found += [f for k in range(5) for f in detector.observe(
                StepRecord(first + k, times[k], waits[k], after_pause=k == 0))]
    detector.close(failed=False)
    found += detector.take_findings()
    assert [(f.step, f.details.get("pattern")) for f in found] == [(s, "startup")
                                                               for s in range(0, 30, 5)]
