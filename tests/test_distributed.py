"""torchrun with several processes (gloo, CPU): per-rank traces, agreed triggers, no hangs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import capture_dirs, load_trace, profiler_steps, trace_files

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parent / "dist_scripts" / "plain_loop_dist.py"


def torchrun(nproc, logdir, *args, timeout=240):
    results_dir = logdir.parent / (logdir.name + "-results")
    results_dir.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--standalone", str(SCRIPT), "--logdir", str(logdir), "--results", str(results_dir),
           *args]
    for _ in range(2):  # a port taken between torchrun's pick and its bind is worth one retry
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            break
    results = [json.loads(p.read_text()) for p in results_dir.glob("rank*.json")]
    return proc, sorted(results, key=lambda r: r["rank"])


def test_two_ranks_one_file_each_and_agreed_manual_capture(tmp_path):
    logs = tmp_path / "logs"
    proc, results = torchrun(2, logs, "--capture-on-rank", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # capture() on rank 1 during step 13 is agreed at step 20 (log_every_n_steps=10): both
    # ranks warm up at 20 and record 21-22
    names = [d.name for d in capture_dirs(logs)]
    assert names == ["step000004-schedule", "step000021-manual"]
    for d in capture_dirs(logs):
        files = trace_files(d)
        assert [f.name.split("_")[0] for f in files] == ["rank0", "rank1"]
        traces = [load_trace(f) for f in files]
        assert [t["distributedInfo"]["rank"] for t in traces] == [0, 1]
        assert all(t["distributedInfo"]["world_size"] == 2 for t in traces)
        assert all(t["distributedInfo"]["backend"] == "gloo" for t in traces)
        assert profiler_steps(traces[0]) == profiler_steps(traces[1])
    assert [r["captures"] for r in results] == [names, names]


def test_ranks_option_limits_trace_writers(tmp_path):
    logs = tmp_path / "logs"
    proc, _ = torchrun(2, logs, "--ranks", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for d in capture_dirs(logs):
        assert [f.name.split("_")[0] for f in trace_files(d)] == ["rank1"]
    assert sorted(p.name for p in (logs / "profcallbacks").glob("*.steps.jsonl")) == \
        ["rank0.steps.jsonl", "rank1.steps.jsonl"]  # every rank still times its steps


def test_rank_that_raises_ends_the_job_without_hanging_or_corrupt_files(tmp_path):
    logs = tmp_path / "logs"
    proc, _ = torchrun(2, logs, "--raise-on-rank", "1", "--no-ddp", timeout=180)
    assert proc.returncode != 0
    assert "fails on purpose" in proc.stderr
    for path in logs.rglob("*.pt.trace.json.gz"):
        load_trace(path)  # every published trace is complete


def test_eight_ranks_more_than_cores(tmp_path):
    logs = tmp_path / "logs"
    proc, results = torchrun(8, logs, "--capture-on-rank", "5", "--steps", "24",
                             timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["rank"] for r in results] == list(range(8))
    assert {r["world_size"] for r in results} == {8}
    for d in capture_dirs(logs):
        workers = [f.name.split(".")[0] for f in trace_files(d)]
        assert len(set(workers)) == 8 and sorted(w.split("_")[0] for w in workers) == \
            sorted(f"rank{r}" for r in range(8))
    assert [d.name for d in capture_dirs(logs)] == ["step000004-schedule", "step000021-manual"]
    report = subprocess.run([sys.executable, "-m", "profcallbacks.cli", "report", str(logs),
                             "--format", "json"], capture_output=True, text=True, timeout=300)
    merged = json.loads(report.stdout)
    assert merged["world_size"] == 8 and merged["ranks"] == list(range(8))
    assert [r["rank"] for r in merged["steps"]["per_rank"]] == list(range(8))
    assert merged["steps"]["slowest_rank"] in range(8)
    assert [len(c["files"]) for c in merged["captures"]] == [8, 8]
    assert {f["rank"] for c in merged["captures"] for f in c["files"]} == set(range(8))


def test_compiled_model_recompiles_are_found_on_the_rank_that_recompiled(tmp_path):
    logs = tmp_path / "logs"
    proc, results = torchrun(2, logs, "--compile-longer-on-rank", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0 never sees a new shape; DDP's own graph breaks (inside torch) are not reported
    assert [r["findings"] for r in results] == [[], [["recompile", 10, 1, "args[0].size(1)"]]]
    lines = (logs / "profcallbacks" / "rank1.findings.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines].count("recompile") == 1
