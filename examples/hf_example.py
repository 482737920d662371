"""The Hugging Face Trainer with ProfilerCallback: a tiny model, synthetic data, no downloads.

Run:     python examples/hf_example.py --output-dir runs/hf
Two CPU processes:
         torchrun --nproc_per_node=2 examples/hf_example.py --output-dir runs/hf-ddp
Then:    tensorboard --logdir runs/hf      (the Trainer's scalars and the captures side by side)
         profcallbacks report runs/hf/runs/<date>_<host>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import Trainer, TrainingArguments  # noqa: E402

from profcallbacks import Schedule  # noqa: E402
from profcallbacks.hf import ProfilerCallback  # noqa: E402

# transformers 4.40 names it `evaluation_strategy`; 4.41 added `eval_strategy`, 4.46 dropped the old name
EVAL_STRATEGY = next(name for name in ("eval_strategy", "evaluation_strategy")
                     if name in {f.name for f in dataclasses.fields(TrainingArguments)})


class TinyRegressor(nn.Module):
    """Two linear layers returning ``{"loss", "logits"}`` as the Trainer expects.

    Forwards are labelled ``tiny.forward.train`` / ``tiny.forward.eval`` in traces;
    ``eval_delay_s`` makes each evaluation batch slow, like a heavy metric.
    """

    def __init__(self, features: int = 16, hidden: int = 32, eval_delay_s: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.eval_delay_s = eval_delay_s

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        name = "tiny.forward.train" if self.training else "tiny.forward.eval"
        with torch.profiler.record_function(name):
            if not self.training and self.eval_delay_s:
                time.sleep(self.eval_delay_s)
            logits = self.net(x).squeeze(-1)
            out: dict[str, Any] = {"logits": logits}
            if labels is not None:
                out["loss"] = (logits - labels).pow(2).mean()
            return out


class SyntheticRegression(Dataset):
    """``size`` random samples ``{"x", "labels"}``; ``labels`` is the sum of ``x``."""

    def __init__(self, size: int, features: int = 16, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=generator)
        self.y = self.x.sum(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def training_args(output_dir: str, *, max_steps: int, grad_accum: int = 1, eval_steps: int = 0,
                  report_to: str = "none", **extra: Any) -> TrainingArguments:
    """CPU-only arguments for a short run; ``eval_steps=0`` turns evaluation off."""
    return TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, gradient_accumulation_steps=grad_accum, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=report_to, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
        eval_steps=eval_steps or None, **{EVAL_STRATEGY: "steps" if eval_steps else "no"}, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/hf")
    parser.add_argument("--logdir", default=None, help="default: the TensorBoard run directory")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--eval-steps", type=int, default=10)
    parser.add_argument("--skip-first", type=int, default=5)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--summary", default=None, help="write captures and findings here (JSON)")
    parsed = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    callback = ProfilerCallback(parsed.logdir, schedule=Schedule(skip_first=parsed.skip_first,
                                                                 warmup=1, active=parsed.active),
                                log_every_n_steps=5)
    args = training_args(parsed.output_dir, max_steps=parsed.max_steps,
                         grad_accum=parsed.grad_accum, eval_steps=parsed.eval_steps,
                         report_to="tensorboard")
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=SyntheticRegression(512),
                      eval_dataset=SyntheticRegression(32, seed=1), callbacks=[callback])
    trainer.train()
    session = callback.session
    if parsed.summary and session is not None:
        with open(f"{parsed.summary}.rank{session.rank.rank}.json", "w", encoding="utf-8") as f:
            json.dump({"logdir": str(session.logdir), "rank": session.rank.rank,
                       "captures": [str(p) for p in callback.captures],
                       "findings": [x.to_dict() for x in callback.findings]}, f)
    if trainer.is_world_process_zero() and session is not None:
        logging.getLogger("hf_example").info("captures in %s: %s", session.logdir,
                                             [p.name for p in callback.captures])


if __name__ == "__main__":
    main()
