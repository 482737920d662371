"""Lightning Trainer with ProfilerCallback: a tiny regression model on synthetic data.

Run:  python examples/lightning_example.py fit --config examples/lightning_cli.yaml
Then: tensorboard --logdir lightning_logs      (SCALARS and PYTORCH_PROFILER side by side)
      profcallbacks report lightning_logs/version_0

Without the YAML file, from Python:
    trainer = Trainer(callbacks=[ProfilerCallback(schedule=Schedule(skip_first=10, active=3))])
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyRegressor(LightningModule):
    """Two linear layers; the loss is logged so the run has scalars of its own."""

    def __init__(self, features: int = 16, hidden: int = 32, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class SyntheticData(LightningDataModule):
    """Random regression samples made in memory (nothing is downloaded)."""

    def __init__(self, samples: int = 512, features: int = 16, batch_size: int = 8) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(samples, features, generator=generator)
        self.data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    return LightningCLI(TinyRegressor, SyntheticData, args=args, run=run)


if __name__ == "__main__":
    main()
