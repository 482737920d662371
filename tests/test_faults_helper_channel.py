"""The export helper's results travel on a pipe of their own: a cluster's ``sitecustomize``
that prints a banner (into the helper's stdout) changes nothing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from helpers import captured_steps, tiny_model, train_step
from profcallbacks import Schedule, StepProfiler


def test_a_sitecustomize_banner_never_reaches_the_result_pipe(tmp_path, monkeypatch, caplog, capfd):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\nprint('Welcome to the cluster! Quota: 93% used')\n"
        "sys.stdout.write('\\x80\\x04 not a pickle\\n')\nsys.stdout.flush()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    model, opt = tiny_model()
    logdir = tmp_path / "run"
    with caplog.at_level(logging.WARNING), StepProfiler(
            logdir, schedule=Schedule(skip_first=2, warmup=0, active=2, repeat=1), stall=None,
            slowdown=None, sync_audit=False, memory=None) as prof:
        for _ in range(6):
            train_step(model, opt)
            prof.step()
    assert [p.name for p in prof.captures] == ["step000002-schedule"]
    assert captured_steps(logdir) == {"step000002-schedule": [2, 3]}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "ValueError" not in err
    assert "Welcome to the cluster" in out  # passed through, as the job's own output


def test_closing_leaves_nothing_unclosed_under_w_error(tmp_path):
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
model, opt = tiny_model()
with StepProfiler({str(tmp_path)!r}, schedule=Schedule(skip_first=1, warmup=0, active=1,
                  repeat=1), stall=None, slowdown=None, sync_audit=False, memory=None) as prof:
    for _ in range(3):
        train_step(model, opt); prof.step()
import gc; gc.collect()
print("captures", len(prof.captures))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-W", "error", "-X", "dev", "-c", script],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["captures", "1"], proc.stderr[-3000:]
    assert "ResourceWarning" not in proc.stderr, proc.stderr[-3000:]
