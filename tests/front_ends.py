"""The same scripted training run through every front end (plain loop, Lightning, HF Trainer).

A front end is a function ``run(logdir, dataset, steps, options, model=SyncModel) ->
list[Finding]``; add one to ``FRONT_ENDS`` and every contract test (tests/test_contract.py) applies
to it. ``model`` is a module class whose ``loss(x)`` is the step's body: by default an ``item()``
and a ``nonzero`` on known lines of ``sync_scenario.py``.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Schedule, SyncAuditConfig
from sync_scenario import scenario_loss

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STEPS = 40
OPTIONS = dict(schedule=Schedule(skip_first=100), tensorboard_scalars=False, slowdown=None,
               watch_capture_file=False, sync_audit=SyncAuditConfig(at_step=3, steps=2))


class SleepyDataset(Dataset):
    """``delay_s`` of loading per sample (0: none); the step's own work is a fixed 20 ms sleep."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.delay_s:  # sleep(0) still gives the CPU away: for milliseconds on a busy machine
            time.sleep(self.delay_s)
        return {"x": torch.randn(4)}


def step_body(linear: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    time.sleep(0.020)
    loss, _ = scenario_loss(linear, x)
    return loss


class SyncModel(torch.nn.Module):
    """The sync scenario's step: ``step_body`` on a 4-to-1 linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return step_body(self.linear, x)


def plain_loop(logdir, dataset, steps, options, model=SyncModel):
    from profcallbacks import StepProfiler

    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    prof = StepProfiler(logdir, **options)
    with prof:
        for i, batch in enumerate(prof.wrap(DataLoader(dataset, batch_size=2))):
            loss = net.loss(batch["x"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if i + 1 == steps:
                break
    return prof.findings


def lightning_trainer(logdir, dataset, steps, options, model=SyncModel, logger=False):
    pl = pytest.importorskip("lightning.pytorch")
    try:
        from profcallbacks.lightning import ProfilerCallback
    except ImportError as exc:
        pytest.skip(f"profcallbacks.lightning not available ({exc})")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def training_step(self, batch, batch_idx):
            return self.net.loss(batch["x"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    callback = ProfilerCallback(logdir, **options)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", logger=logger, callbacks=[callback],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(logdir) if logdir else None)
    trainer.fit(Module(), DataLoader(dataset, batch_size=2))
    return callback.findings


def hf_trainer(logdir, dataset, steps, options, model=SyncModel, report_to=(), logging_steps=0):
    transformers = pytest.importorskip("transformers")
    try:
        from profcallbacks.hf import ProfilerCallback
    except ImportError as exc:
        pytest.skip(f"profcallbacks.hf not available ({exc})")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(self, x):
            return {"loss": self.net.loss(x)}

    torch.manual_seed(0)
    callback = ProfilerCallback(logdir, **options)
    args = transformers.TrainingArguments(
        output_dir=str(logdir / "out"), max_steps=steps, per_device_train_batch_size=2,
        use_cpu=True, report_to=list(report_to), save_strategy="no",
        logging_strategy="steps" if logging_steps else "no", logging_steps=logging_steps or 500,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    transformers.Trainer(model=Model(), args=args, train_dataset=dataset,
                         callbacks=[callback]).train()
    return callback.findings


FRONT_ENDS = {"plain": plain_loop, "lightning": lightning_trainer, "hf": hf_trainer}
