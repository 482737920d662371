"""``step()`` called from two threads at once (real threads, real backward passes, capture
windows open and closing): the process never crashes (kineto's window work on two threads at
once segfaulted), the window work stays on the thread that stepped it first, one warning names
both threads, and the run ends clean (what it published is whole, no staging entries, no run
lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import capture_dirs, load_trace, profiler_steps, trace_files
from profcallbacks.layout import RUN_LOCK, STAGING_DIR

SCRIPT = textwrap.dedent("""
    import sys, threading
    import torch
    from torch import nn
    from profcallbacks import Schedule, StepProfiler

    prof = StepProfiler(sys.argv[1], schedule=Schedule(skip_first=2, warmup=1, active=3, wait=4,
                                                       repeat=4),
                        tensorboard_scalars=False, watch_capture_file=False, slowdown=None,
                        sync_audit=False, memory=None, stall=None)
    errors = []

    def train(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        try:
            for _ in range(60):
                loss = model(torch.randn(32, 64)).pow(2).mean()
                opt.zero_grad()
                loss.backward()  # the other thread may be in kineto meanwhile
                opt.step()
                prof.step()
        except BaseException as exc:
            errors.append(repr(exc))

    with prof:
        threads = [threading.Thread(target=train, args=(i,), name=f"trainer-{i}")
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print("errors", errors)
    print("captures", sorted(p.name for p in prof.captures))
""")


@pytest.mark.parametrize("attempt", range(3))
def test_two_threads_stepping_at_once_neither_crash_nor_corrupt(tmp_path: Path,
                                                                attempt: int) -> None:
    logdir = tmp_path / "logs"
    script = tmp_path / "two_threads.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(logdir)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])  # -11: a segfault
    assert "errors []" in proc.stdout  # no exception reached either training thread
    warnings = [line for line in proc.stderr.splitlines() if "is called from thread" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "trainer-0" in warnings[0] and "trainer-1" in warnings[0]
    published = sorted(p.name for p in capture_dirs(logdir))
    assert f"captures {published}" in proc.stdout  # what it says it published is there, whole
    for capture in capture_dirs(logdir):
        for trace in trace_files(capture):
            assert profiler_steps(load_trace(trace))
    assert not (logdir / STAGING_DIR).exists()
    assert not (logdir / "profcallbacks" / RUN_LOCK).exists()
