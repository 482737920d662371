"""Smoke test of an installed profcallbacks: import, CLI --help, a 20-step loop and its report.

Run with the interpreter of the environment under test, outside the source tree:
``python scripts/smoke_test.py RUN_DIR``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

import profcallbacks
from profcallbacks import Schedule, StepProfiler


def main(logdir: Path) -> None:
    source = Path(__file__).resolve().parents[1] / "src"
    assert source not in Path(profcallbacks.__file__).resolve().parents, profcallbacks.__file__
    cli = Path(sys.executable).with_name("profcallbacks")
    subprocess.run([str(cli), "--help"], check=True, stdout=subprocess.DEVNULL)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with StepProfiler(logdir, schedule=Schedule(skip_first=5, active=3),
                      log_every_n_steps=5) as prof:
        for batch in prof.wrap([torch.randn(4, 8) for _ in range(20)]):
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    assert len(prof.captures) == 1, prof.captures
    report = subprocess.run([str(cli), "report", str(logdir), "--format", "json"], check=True,
                            capture_output=True, text=True)
    data = json.loads(report.stdout)
    print(f"profcallbacks {profcallbacks.__version__}: 20 steps, {len(prof.captures)} capture, "
          f"report keys {sorted(data)[:4]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
