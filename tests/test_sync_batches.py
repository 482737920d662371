"""CPU runs: syncs on values computed from the step's batch are found; host-only tensors are not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from profcallbacks import StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import audit_findings_of
from sync_scenario import location

OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
               watch_capture_file=False, memory=None)
AUDIT = SyncAuditConfig(at_step=4, repeat_at=())  # steps 4-6: a new epoch begins at step 5


def user_sites(prof):
    return {(f.details["location"], f.details["op"]) for f in audit_findings_of(prof.findings)}


def loader() -> DataLoader:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,)))
    return DataLoader(data, batch_size=8, shuffle=True)  # 5 batches an epoch, a seed per epoch


def batch_syncs(x, y, model):
    positives = torch.nonzero(y > 0)  # SYNC: nonzero
    picked = x[y > 0]  # SYNC: mask
    share = (y > 0).float().mean().item()  # SYNC: statistic
    return model(picked).pow(2).mean() + 0.0 * positives.numel() * share


def train(tmp_path, body, epochs=2) -> StepProfiler:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # host-side step counters
    prof = StepProfiler(tmp_path, sync_audit=AUDIT, **OPTIONS)
    data = loader()
    with prof:
        for _ in range(epochs):
            for x, y in prof.wrap(data):
                loss = body(x, y, model)
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
    return prof


def test_syncs_on_a_wrapped_batch_are_found_on_a_cpu_run(tmp_path):
    here = __file__
    assert user_sites(train(tmp_path, batch_syncs)) == {
        (location("nonzero", here), "nonzero"), (location("mask", here), "boolean mask indexing"),
        (location("statistic", here), "item")}


def host_work(x, y, model):
    ix = torch.randint(0, 40, (8,))
    order = ix.tolist()  # a host index tensor: no device value
    counts = torch.bincount(torch.tensor(order)).nonzero()  # nor what is built from it
    return model(x).pow(2).mean() + 0.0 * counts.numel()


def test_adamw_host_indices_and_the_loaders_own_tensors_stay_out(tmp_path):
    prof = train(tmp_path, host_work)
    assert user_sites(prof) == set()
    assert [f for f in prof.findings if f.kind == "sync_point"] == []


def test_memmap_style_batches_not_handed_over_stay_out(tmp_path):
    """nanoGPT's get_batch: host indices into a NumPy array, the batch built by the user."""
    data = np.arange(10_000, dtype=np.int64)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prof = StepProfiler(tmp_path, sync_audit=AUDIT, **OPTIONS)
    with prof:
        for _ in range(8):
            ix = torch.randint(len(data) - 9, (8,))
            x = torch.stack([torch.from_numpy(data[i:i + 4].astype(np.float32)) for i in ix])
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    assert [f for f in prof.findings if f.kind == "sync_point"] == []


def test_lightning_batch_is_followed(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            keep = torch.nonzero(y > 0)  # SYNC: lightning-nonzero
            return self.linear(x).pow(2).mean() + 0.0 * keep.numel()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    callback = ProfilerCallback(tmp_path, sync_audit=AUDIT, **OPTIONS)
    trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False, callbacks=[callback],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(Module(), loader())
    sites = {(f.details["location"], f.details["op"]) for f in audit_findings_of(callback.findings)}
    assert sites == {(location("lightning-nonzero", __file__), "nonzero")}
