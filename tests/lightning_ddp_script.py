"""Two-process CPU DDP fit with ProfilerCallback; run by tests/test_lightning.py in a subprocess.

Usage: python tests/lightning_ddp_script.py ROOT_DIR
Lightning's launcher starts the second process by running this script again.
"""

import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Schedule
from profcallbacks.lightning import ProfilerCallback


class SlowData(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.002)  # a loader-bound run, so the stall detector has something to say
        return torch.full((16,), float(index % 7))


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    root = Path(sys.argv[1])
    callback = ProfilerCallback(schedule=Schedule(skip_first=2, warmup=1, active=2, wait=2, repeat=2),
                                log_every_n_steps=5)
    trainer = pl.Trainer(default_root_dir=root, accelerator="cpu", devices=2, strategy="ddp",
                         max_steps=14, callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Tiny(), DataLoader(SlowData(), batch_size=4))
    result = {"rank": trainer.global_rank, "log_dir": trainer.log_dir,
              "captures": [p.name for p in callback.captures],
              "findings": [f.to_dict() for f in callback.findings]}
    (root / f"result.rank{trainer.global_rank}.json").write_text(json.dumps(result))
    # as torch documents: a process that exits with its gloo group alive may abort in the
    # interpreter's finalisation (gloo threads still holding tensors; pytorch/pytorch#190489)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
