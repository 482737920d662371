"""A log directory made read-only in the middle of a capture's write (a real tmpfs remounted
read-only while the export helper writes, writable again before the run ends) leaves nothing
half written: no raw save, no ``.writing`` file, no staging entry; what is published is whole,
and the report reads the run."""

from __future__ import annotations

import gzip
import json
import logging
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from faults_helpers import SmallDisk, small_disk_fixture  # noqa: F401  (the small_disk fixture)
from helpers import capture_dirs, trace_files
from profcallbacks import Schedule, StepProfiler
from profcallbacks.cli import main
from profcallbacks.layout import STAGING_DIR

WINDOW_END = 12  # the capture records steps 10-12; its export runs from there


def _leftovers(logdir: Path) -> list[str]:
    """Half-written or unpublished entries anywhere under ``logdir``."""
    names = (".writing", ".tmp", ".ready", ".raw.json", ".publishing")
    return sorted(str(p.relative_to(logdir)) for p in logdir.rglob("*")
                  if p.name.endswith(names) or p.name.startswith(".raw-")
                  or STAGING_DIR in p.parts)


@pytest.mark.parametrize("read_only_s", [0.0, 0.05, 0.3])
def test_read_only_in_the_middle_of_a_write_leaves_nothing_half_written(
        small_disk: SmallDisk, caplog: pytest.LogCaptureFixture, read_only_s: float,
        capsys: pytest.CaptureFixture[str]) -> None:
    logdir = small_disk.root / "run"
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(16)])
    opt = torch.optim.Adam(model.parameters(), foreach=False)  # many events: a longer write
    with caplog.at_level(logging.WARNING), \
            StepProfiler(logdir, schedule=Schedule(skip_first=10, warmup=0, active=3, repeat=1),
                         tensorboard_scalars=False, stall=None, slowdown=None, sync_audit=False,
                         memory=None, watch_capture_file=False) as prof:
        for step in range(40):
            loss = model(torch.randn(8, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if step == WINDOW_END:  # kineto saved the raw trace; the helper now writes it
                time.sleep(read_only_s)
                small_disk.read_only(True)
            if step == WINDOW_END + 20:
                small_disk.read_only(False)
    assert _leftovers(logdir) == []
    for capture in capture_dirs(logdir):  # what was published is whole
        for trace in trace_files(capture):
            assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    if not capture_dirs(logdir):  # the write failed: said so, with the cause
        assert any("could not export capture step000010" in r.getMessage()
                   and "read-only" in r.getMessage() for r in caplog.records), caplog.text
    capsys.readouterr()
    assert main(["report", str(logdir)]) == 0
