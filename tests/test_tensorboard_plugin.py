"""The example's captures, as the real TensorBoard PyTorch profiler plugin serves them."""

import gzip
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import capture_dirs, captured_steps
from profcallbacks.layout import SUMMARY_SUFFIX, summary_file_name
from tb_server import tensorboard

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).parents[1] / "examples" / "plain_loop.py"


@pytest.fixture(scope="module")
def example_logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("tb") / "demo"
    subprocess.run([sys.executable, str(EXAMPLE), "--logdir", str(logdir), "--steps", "90",
                    "--delay-ms", "1.0"], check=True, capture_output=True, timeout=300)
    return logdir


def test_plugin_lists_each_capture_with_its_rank_steps_and_dataloader_time(example_logdir):
    expected = captured_steps(example_logdir)
    assert len(expected) == 4  # the automatic baseline, two scheduled, one manual
    host = socket.gethostname().split(".")[0]
    with tensorboard(example_logdir) as tb:
        runs = tb.wait_for_runs(set(expected))
        assert sorted(runs) == sorted(expected)  # staging directory never shows up as a run
        for run, steps in expected.items():
            assert "Overview" in tb.get("/views", run=run)
            workers = tb.get("/workers", run=run, view="Overview")
            assert workers == [f"rank0_{host}".replace(".", "-")]
            (span,) = tb.get("/spans", run=run, worker=workers[0])
            overview = tb.get("/overview", run=run, worker=workers[0], span=span)
            rows = overview["steps"]["rows"]
            assert [int(row[0]) for row in rows] == steps
            columns = [c["name"] for c in overview["steps"]["columns"] if c.get("type") == "number"]
            loader_share = next(c for c in overview["performance"][0]["children"]
                                if c["name"] == "DataLoader")["extra"]
            assert columns[0] == "DataLoader" and all(row[1] > 0 for row in rows)
            assert loader_share > 5.0  # percent of step time: the slow loader is visible


def test_capture_dirs_appear_whole(tmp_path):
    """Watched while the job runs: a capture directory is never seen without its whole trace."""
    logdir = tmp_path / "demo"
    job = subprocess.Popen([sys.executable, str(EXAMPLE), "--logdir", str(logdir), "--steps", "90",
                            "--delay-ms", "1.0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first_seen: dict[str, list[str]] = {}
    while job.poll() is None:
        for d in capture_dirs(logdir) if logdir.is_dir() else []:
            if d.name not in first_seen:
                first_seen[d.name] = sorted(p.name for p in d.iterdir())
                for path in d.iterdir():  # complete at first sight: the gzip stream ends, JSON parses
                    if path.name.endswith(SUMMARY_SUFFIX):
                        assert json.loads(path.read_text())["trace"]
                        continue
                    with gzip.open(path, "rt") as f:
                        assert "traceEvents" in json.load(f)
        time.sleep(0.002)
    assert job.returncode == 0, job.stderr.read() if job.stderr else ""
    assert len(first_seen) == 4, first_seen  # the baseline, two scheduled captures, one manual
    for name, files in first_seen.items():  # the trace and its summary, published together
        [trace] = [f for f in files if f.endswith(".pt.trace.json.gz")]
        assert files == sorted([trace, summary_file_name(trace)]), (name, files)
    assert not (logdir / ".profcallbacks-staging").exists()  # removed once empty


def test_plugin_lists_captures_of_every_front_end(tmp_path):
    """The plain loop, the Lightning Trainer and the HF Trainer, viewed by one TensorBoard."""
    from front_ends import FRONT_ENDS, OPTIONS, SleepyDataset
    from profcallbacks import Schedule

    options = {**OPTIONS, "schedule": Schedule(skip_first=2, warmup=1, active=3), "sync_audit": False}
    for name, run in FRONT_ENDS.items():
        run(tmp_path / name, SleepyDataset(0.004), 8, options)
    expected = {f"{name}/step000003-schedule" for name in FRONT_ENDS}
    with tensorboard(tmp_path) as tb:
        runs = tb.wait_for_runs(expected)
        assert sorted(runs) == sorted(expected)
        for run in runs:
            (worker,) = tb.get("/workers", run=run, view="Overview")
            (span,) = tb.get("/spans", run=run, worker=worker)
            overview = tb.get("/overview", run=run, worker=worker, span=span)
            rows = overview["steps"]["rows"]
            assert [int(row[0]) for row in rows] == [3, 4, 5], run
            assert all(row[1] > 0 for row in rows), f"{run}: no DataLoader time"
