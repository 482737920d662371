"""Real runs for the report tests: a plain loop through StepProfiler with a slow DataLoader."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Finding, Schedule, StepProfiler

NASTY = '<script>alert("x")</script> & <b>bold</b> \'quoted\''


class SlowDataset(Dataset):
    """Random samples that each take ``delay_s`` to load."""

    def __init__(self, size: int, delay_s: float) -> None:
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(0))
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[index]


def plain_run(logdir: Path, *, steps: int = 30, delay_s: float = 0.0015, nasty: bool = True,
              log_every_n_steps: int = 5) -> Path:
    """Trains a tiny model for ``steps`` steps: one scheduled capture (steps 5-7), one manual
    (from step 16), step summaries every ``log_every_n_steps`` steps, and one finding whose text is
    hostile HTML."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(steps * 4, delay_s), batch_size=4)
    prof = StepProfiler(logdir, schedule=Schedule(skip_first=4, warmup=1, active=3),
                        log_every_n_steps=log_every_n_steps, tensorboard_scalars=False,
                        watch_capture_file=False)
    with prof:
        for step, x in enumerate(prof.wrap(loader)):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == 12 and nasty:
                prof.session.emit(Finding("sync_point", step=step, rank=0, severity="info",
                                          message=NASTY, details={"location": "train.py:12",
                                                                  "op": "<aten::item>"}))
            prof.step()
            if step == 15:
                prof.capture(steps=2)
    return logdir


_RANK_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from report_runs import plain_run
plain_run(Path({logdir!r}), steps=20, delay_s={delay}, nasty=False)
"""


def two_rank_run(logdir: Path, *, slow_rank: int = 1, first: int | None = None,
                 outputs: list[str] | None = None) -> Path:
    """Two processes with RANK/WORLD_SIZE set (as torchrun sets them) writing one log directory;
    ``slow_rank`` waits much longer for its data. With ``first``, that rank starts alone and the
    other only once it has staged a capture (as when one rank imports or starts much later).
    Each rank's output is appended to ``outputs``."""
    procs = []
    staging = logdir / ".profcallbacks-staging"
    for rank in ((first, 1 - first) if first is not None else (0, 1)):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        delay = 0.006 if rank == slow_rank else 0.0
        code = _RANK_SCRIPT.format(tests=str(Path(__file__).parent), logdir=str(logdir), delay=delay)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 240
        while first is not None and len(procs) == 1 and not any(
                p.name.startswith(".raw-") for p in (staging.iterdir() if staging.exists() else ())):
            assert time.monotonic() < deadline and procs[0].poll() is None, "nothing staged"
            time.sleep(0.01)
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        text = out.decode(errors="replace")
        if outputs is not None:
            outputs.append(text)
        assert proc.returncode == 0, text[-3000:]
    return logdir
