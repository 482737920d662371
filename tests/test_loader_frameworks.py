"""Worker timing of the loaders Lightning's and HF's Trainers iterate themselves: with the real
Trainers (tiny models, ``DataLoader(num_workers=2)`` over a dataset that decodes slowly at a known
line), the stall finding names "fetch" and that line, and the loader keeps nothing of ours."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from helpers import QUIET
from loader_cases import Cheap, SlowDecode, SlowDecodeRecords, marked_line
from profcallbacks import StallConfig
from profcallbacks.detect.worker_hooks import TimedCollate, WorkerInit
from profcallbacks.findings import DATALOADER_STALL, Finding

STALL = StallConfig(min_duration_s=0.5, min_steps=12)
LINE = f"loader_cases.py:{marked_line('decode')}"


def _stall(findings: list[Finding]) -> Finding:
    stalls = [f for f in findings if f.kind == DATALOADER_STALL]
    assert stalls, [f.message for f in findings]
    return stalls[0]


def _names_fetch_at_the_line(stall: Finding) -> None:
    """The finding's breakdown: fetch is the largest part, at the dataset's decoding line, in
    both workers, by far against the rest of their batch (their own measured times)."""
    workers = stall.details["loader_workers"]
    assert workers["part"] == "fetch", stall.message
    assert LINE in stall.message and "fetch" in stall.message, stall.message
    hot = workers["workers"]["lines"]
    assert hot[0]["line"].endswith(f"{LINE} SlowDecode.__getitem__"), hot
    assert hot[0]["phase"] == "fetch" and hot[0]["share"] > 0.5, hot
    rows = workers["workers"]["rows"]
    assert sorted(r["worker"] for r in rows) == [0, 1], rows
    for row in rows:
        assert row["fetch_ms"] > 5 * (row["collate_ms"] + row["send_ms"]), row


def _untouched(loader: DataLoader[Any]) -> None:
    """Nothing of the timing stays on the loader or its class."""
    assert "_get_iterator" not in vars(loader)
    assert not isinstance(loader.worker_init_fn, WorkerInit)
    assert not isinstance(loader.collate_fn, TimedCollate)
    assert DataLoader._get_iterator.__qualname__ == "DataLoader._get_iterator"


def test_lightning_trainer_names_fetch_and_the_decoding_line(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.seed import pl_worker_init_function

    from lightning_ddp_script import Tiny  # one linear layer on 16 features, SGD
    from profcallbacks.lightning import ProfilerCallback

    loader = DataLoader(SlowDecode(n=400), batch_size=4, num_workers=2)
    callback = ProfilerCallback(tmp_path, **{**QUIET, "stall": STALL})
    trainer = pl.Trainer(default_root_dir=tmp_path, callbacks=[callback], max_steps=60,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, logger=False, limit_val_batches=0)
    collate = loader.collate_fn
    trainer.fit(Tiny(), loader)
    _names_fetch_at_the_line(_stall(callback.findings))
    _untouched(loader)
    # Lightning's own seeding of workers (PL_SEED_WORKERS, set by seed_everything(workers=True)
    # anywhere earlier in the process) is the only worker_init_fn a fit may leave
    init = loader.worker_init_fn
    assert init is None or getattr(init, "func", None) is pl_worker_init_function, init
    assert loader.collate_fn is collate


def test_hf_trainer_names_fetch_and_the_decoding_line(tmp_path: Path) -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    from profcallbacks.hf import ProfilerCallback

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}

    callback = ProfilerCallback(tmp_path / "prof", **{**QUIET, "stall": STALL})
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=40, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1000, save_strategy="no", report_to="none",
        use_cpu=True, dataloader_num_workers=2, disable_tqdm=True)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=SlowDecodeRecords(n=400),
                                   callbacks=[callback])
    loaders: list[Any] = []
    get = trainer.get_train_dataloader
    trainer.get_train_dataloader = lambda: loaders.append(get()) or loaders[-1]  # type: ignore[method-assign]
    trainer.train()
    _names_fetch_at_the_line(_stall(callback.findings))
    inner = vars(loaders[0])["base_dataloader"]  # accelerate's DataLoaderShard wraps it
    _untouched(inner)


def test_a_trainers_persistent_workers_are_timed_pass_after_pass() -> None:
    """The hooks a Trainer's loader gets (as ``iter(loader)`` inside the Trainer): persistent
    workers serve two passes, each batch keyed by its pass; detaching leaves nothing behind."""
    from profcallbacks.detect.loader_workers import LoaderWorkers

    workers = LoaderWorkers(lambda: 0)
    loader = DataLoader(Cheap(64), batch_size=8, num_workers=2, persistent_workers=True)
    collate = loader.collate_fn
    workers.attach(loader)
    workers.want("test", True, sampling=False)
    for _ in range(2):
        for _ in loader:  # as a Trainer iterates: iter(loader), next() until it ends
            pass
    workers.drain()
    keys = {(b.pass_, b.idx) for b in workers.batches}
    assert keys == {(p, i) for p in (0, 1) for i in range(8)}, sorted(keys)
    assert {key[1:] for key in workers.waits} == keys  # the loop's wait for each of them
    iterator = loader._iterator
    workers.detach()
    _untouched(loader)
    assert loader.collate_fn is collate and loader.worker_init_fn is None
    assert not {"_next_data", "_reset"} & set(vars(iterator))
    assert [b.tolist() for b in loader][0] == [[float(i)] * 16 for i in range(8)]
