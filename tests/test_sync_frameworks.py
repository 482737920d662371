"""Library sync sites through the real HF Trainer and Lightning, with their known fixes."""

import pytest
import torch
from torch.utils.data import DataLoader

from profcallbacks import SyncAuditConfig


class XDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return {"x": torch.randn(4)}


def library_sites_of(findings, library):
    return [lib for f in findings if f.kind == "sync_point" and f.details["library"] == library
            for lib in f.details["library_sites"]]


def test_hf_trainer_nan_inf_filter_is_a_library_site_with_its_fix(tmp_path):
    transformers = pytest.importorskip("transformers")
    from profcallbacks.hf import ProfilerCallback

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x):
            return {"loss": self.linear(x).pow(2).mean()}

    def train(filter_on):
        callback = ProfilerCallback(tmp_path / str(filter_on), schedule=None, stall=None,
                                    slowdown=None, tensorboard_scalars=False,
                                    watch_capture_file=False, sync_audit=SyncAuditConfig(at_step=2))
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=2,
            use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
            disable_tqdm=True, logging_nan_inf_filter=filter_on)
        transformers.Trainer(model=Model(), args=args, train_dataset=XDataset(),
                             callbacks=[callback]).train()
        return library_sites_of(callback.findings, "transformers")

    (site,) = [s for s in train(True) if s["fix"]]
    assert "transformers/trainer.py:" in site["location"] and site["op"] == "bool(tensor)"
    assert "logging_nan_inf_filter=False" in site["fix"]
    assert not any("trainer.py" in s["location"] for s in train(False))


def test_lightning_prog_bar_logging_is_a_library_site_with_its_fix(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = self.linear(batch["x"]).pow(2).mean()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    callback = ProfilerCallback(tmp_path, schedule=None, stall=None, slowdown=None,
                                tensorboard_scalars=False, watch_capture_file=False,
                                sync_audit=SyncAuditConfig(at_step=2))
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", logger=False, callbacks=[callback],
                         enable_checkpointing=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(Module(), DataLoader(XDataset(), batch_size=2))
    sites = library_sites_of(callback.findings, "lightning")
    fixes = [s for s in sites if s["fix"]]
    assert fixes and all("prog_bar=False" in s["fix"] for s in fixes), sites
    assert not library_sites_of(callback.findings, "torch")  # AdamW's step counters
