"""out_of_memory through the Lightning and Hugging Face Trainer front ends."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import QUIET
from profcallbacks import MemoryConfig
from profcallbacks.findings import OUT_OF_MEMORY
from profcallbacks.layout import findings_file


def test_lightning_out_of_memory_reaches_the_findings_file(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 7:
                raise MemoryError("cannot allocate")
            return self.linear(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = ProfilerCallback(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    trainer = pl.Trainer(max_steps=20, accelerator="cpu", logger=False, callbacks=[callback],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.raises(MemoryError):
        trainer.fit(Module(), torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=2))
    written = [json.loads(line) for line in findings_file(tmp_path, 0).read_text().splitlines()]
    assert [(f["kind"], f["step"]) for f in written] == [(OUT_OF_MEMORY, 7)]


def test_hf_out_of_memory_when_close_is_called_in_except(tmp_path):
    transformers = pytest.importorskip("transformers")
    from profcallbacks.hf import ProfilerCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 6:
                raise MemoryError("cannot allocate")
            return {"loss": self.linear(x).sum()}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"x": torch.randn(4)}

    callback = ProfilerCallback(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Data(),
                                   callbacks=[callback])
    try:
        trainer.train()
    except MemoryError:
        callback.close()
    written = [json.loads(line) for line in findings_file(tmp_path, 0).read_text().splitlines()]
    assert [(f["kind"], f["step"]) for f in written] == [(OUT_OF_MEMORY, 5)]
