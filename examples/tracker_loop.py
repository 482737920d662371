"""A plain loop whose profcallbacks scalars and findings go into your W&B or MLflow run.

Run:  WANDB_MODE=offline python examples/tracker_loop.py --tracker wandb --logdir runs/tracked
      python examples/tracker_loop.py --tracker mlflow --logdir runs/tracked
(MLflow logs to $MLFLOW_TRACKING_URI, e.g. sqlite:///mlflow.db.)
"""

from __future__ import annotations

import argparse
import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from profcallbacks import Schedule, StepProfiler


def train(logdir: str, steps: int, metrics_sink: object) -> StepProfiler:
    """``steps`` optimizer steps of a tiny regression, profiled into ``metrics_sink``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(steps * 8, 32)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    prof = StepProfiler(logdir, schedule=Schedule(skip_first=5, active=2), log_every_n_steps=5,
                        metrics_sink=metrics_sink)  # type: ignore[arg-type]
    with prof:
        for x_batch, y_batch in prof.wrap(loader):
            loss = nn.functional.mse_loss(model(x_batch), y_batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"loss {loss.item():.4f}", end="\r")  # a sync point the audit reports
            prof.step()
    return prof


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tracker", choices=["wandb", "mlflow"], required=True)
    parser.add_argument("--logdir", default="runs/tracked")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.tracker == "wandb":
        import wandb

        from profcallbacks.integrations.wandb_run import WandbSink

        with wandb.init(project="profcallbacks-example") as run:
            train(args.logdir, args.steps, WandbSink(run))
    else:
        import mlflow

        from profcallbacks.integrations.mlflow_run import MlflowSink

        with mlflow.start_run():
            train(args.logdir, args.steps, MlflowSink())


if __name__ == "__main__":
    main()
