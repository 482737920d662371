"""Summaries next to each rank's trace: written by the export helper of a real 4-rank gloo run,
read by the report instead of the traces, and written in bulk by ``profcallbacks summarize``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import helpers
from profcallbacks.capture.summary_file import MAX_SUMMARY_BYTES, load_summary, tie_of
from profcallbacks.layout import MERGED_FILE, TRACE_FILE, summary_file_name
from profcallbacks.report import build_report, locate_run

SCRIPT = Path(__file__).parent / "dist_scripts" / "merged_trace_dist.py"
SUMMARIZE = Path(__file__).parent / "dist_scripts" / "summarize_dist.py"
RANKS = 4
NOBODY = 65534


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    """A real 4-rank gloo run (one scheduled capture of 3 steps), copied where any user may read
    it (the report of it runs as another user below, for whom the traces are unreadable)."""
    base = Path(os.environ.get("TMPDIR", "/tmp"))
    out = tmp_path_factory.mktemp("summaries") / "logs"
    proc = helpers.torchrun(SCRIPT, RANKS, "--logdir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    shared = Path(os.path.realpath(base)) / f"profcallbacks-summaries-{os.getpid()}"
    shutil.rmtree(shared, ignore_errors=True)
    shutil.copytree(out, shared)  # copy2: sizes and modification times kept
    yield shared
    shutil.rmtree(shared, ignore_errors=True)


def traces(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("step*/*") if TRACE_FILE.match(p.name))


def comparable(report: dict) -> dict:
    """The report without what says where each number came from."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()
                    if k not in ("source", "sources", "summaries", "logdir")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(report)


def report_as_cli(root: Path, *extra: str, user: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "profcallbacks.cli", "report", str(root), "--format", "json",
           *extra]
    if user is not None:  # the traces are unreadable to that user, everything else readable
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": "/tmp"})


def test_no_reader_of_traces_takes_a_summary_for_a_trace(logdir):
    """HTA reads every ``.json`` and ``.gz`` file of a directory as a rank's trace, TensorBoard's
    plugin every name its pattern matches, and scripts glob ``*.pt.trace.json*``."""
    [capture] = helpers.capture_dirs(logdir)
    names = os.listdir(capture)
    assert sum(name.endswith(".summary") for name in names) == RANKS
    hta = [n for n in names if n.endswith((".json", ".gz"))]
    assert all(TRACE_FILE.match(n) or MERGED_FILE.match(n) for n in hta), hta
    assert sorted(p.name for p in capture.glob("*.pt.trace.json*")) == sorted(
        n for n in names if TRACE_FILE.match(n))


def test_each_rank_writes_a_small_summary_tied_to_its_trace(logdir):
    files = traces(logdir)
    assert len(files) == RANKS
    for trace in files:
        summary = trace.with_name(summary_file_name(trace.name))
        record = json.loads(summary.read_bytes())
        assert summary.stat().st_size < 64 << 10 < MAX_SUMMARY_BYTES
        assert record["trace"]["bytes"] == trace.stat().st_size
        assert record["trace"]["blake2b"] == tie_of(trace)["blake2b"]
        assert record["worker"] == trace.name.split(".")[0]
        assert record["host"] and record["verdict"]["kind"]
        assert len(record["steps"]) == 3
        # 4 all-reduces per step, each waited on gloo's threads: arrival and wait per call
        assert len(record["collectives"]) == 12
        assert {c[0] for c in record["collectives"]} == {0, 1, 2}
        assert load_summary(trace).status == "match"
    assert not list(logdir.glob("**/*.writing"))


def test_report_from_summaries_equals_report_from_traces(logdir):
    from_summaries = build_report(locate_run(logdir))
    from_traces = build_report(locate_run(logdir), summaries=False)
    assert from_summaries["summaries"] == {"read": RANKS, "parsed": 0, "missing": 0, "stale": []}
    assert from_traces["summaries"]["parsed"] == RANKS
    assert {f["source"] for c in from_summaries["captures"] for f in c["files"]} == {"summary"}
    assert {f["source"] for c in from_traces["captures"] for f in c["files"]} == {"trace"}
    assert comparable(from_summaries) == comparable(from_traces)
    assert from_summaries["verdict"]["kind"] == from_traces["verdict"]["kind"]
    assert len(from_summaries["captures"][0]["rank_verdicts"]) == RANKS


@pytest.mark.skipif(os.geteuid() != 0 and shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run the report as another user")
def test_report_reads_no_trace_when_the_traces_are_unreadable(logdir):
    expected = report_as_cli(logdir, "--no-summaries")
    assert expected.returncode == 0, expected.stderr
    shared = Path(tempfile.mkdtemp(prefix="profcallbacks-unreadable-", dir=logdir.parent))
    os.chmod(shared, 0o755)  # outside pytest's own directory, which only its owner may enter
    root = shared / "logs"
    shutil.copytree(logdir, root)
    for trace in traces(root):
        trace.chmod(0)  # no byte of it can be read: a report that opened one would say so
    user = NOBODY if os.geteuid() == 0 else None
    try:
        got = report_as_cli(root, user=user)
        assert got.returncode == 0, got.stderr
        report = json.loads(got.stdout)
        assert report["problems"] == []
        assert report["summaries"] == {"read": RANKS, "parsed": 0, "missing": 0, "stale": []}
        assert comparable(report) == comparable(json.loads(expected.stdout))
        parsing = report_as_cli(root, "--no-summaries", user=user)  # the control: it fails
        assert "Permission denied" in parsing.stderr or json.loads(parsing.stdout)["problems"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_changed_trace_makes_its_summary_stale_and_is_read_again(logdir, tmp_path):
    root = tmp_path / "logs"
    shutil.copytree(logdir, root)
    first, second, third = traces(root)[:3]
    first.write_bytes(second.read_bytes())  # another rank's trace under rank 0's name
    os.utime(third)  # touched only: the hash still matches, the summary is used
    report = build_report(locate_run(root))
    use = report["summaries"]
    assert (use["read"], use["parsed"], use["missing"]) == (RANKS - 1, 1, 0)
    assert [s["file"] for s in use["stale"]] == [str(first)]
    sources = {f["path"]: f["source"] for f in report["captures"][0]["files"]}
    assert sources[str(first.relative_to(root))] == "trace"
    assert sources[str(third.relative_to(root))] == "summary"
    first.with_name(summary_file_name(first.name)).unlink()
    assert build_report(locate_run(root))["summaries"]["missing"] == 1
    if os.geteuid() == 0:  # a summary of another user than its trace's is never taken
        os.chown(third.with_name(summary_file_name(third.name)), NOBODY, NOBODY)
        stale = build_report(locate_run(root))["summaries"]["stale"]
        assert any(s["file"] == str(third) and "owned by user" in s["why"] for s in stale)


def foreign_copy(logdir: Path, into: Path) -> list[Path]:
    """The run's traces as foreign traces (no summaries), plus two public ones."""
    into.mkdir()
    out = []
    for trace in traces(logdir):
        out.append(into / trace.name)
        shutil.copy2(trace, out[-1])
    for name in ("kineto-traces/resnet50_num_workers_0.pt.trace.json.gz",
                 "hta-traces/cpu_only_rank34.pt.trace.json.gz"):
        out.append(into / Path(name).name)
        shutil.copy2(Path(__file__).parent / "data" / name, out[-1])
    return out


def summaries_of(files: list[Path]) -> dict[str, bytes]:
    return {f.name: f.with_name(summary_file_name(f.name)).read_bytes() for f in files}


def summarize(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profcallbacks.cli", "summarize", *args],
                          capture_output=True, text=True, timeout=300)


def test_summarize_with_a_pool_writes_what_one_process_writes(logdir, tmp_path):
    one = foreign_copy(logdir, tmp_path / "one")
    two = foreign_copy(logdir, tmp_path / "two")
    done = summarize(str(tmp_path / "one"))
    assert done.returncode == 0, done.stderr
    assert f"{len(one)} summaries written, 0 kept" in done.stdout
    done = summarize(str(tmp_path / "two"), "--processes", "2")
    assert done.returncode == 0, done.stderr
    assert summaries_of(one) == summaries_of(two)
    again = summarize(str(tmp_path / "two"), "--processes", "2")
    assert f"0 summaries written, {len(two)} kept" in again.stdout
    report = build_report(locate_run(tmp_path / "one"))
    assert report["summaries"]["read"] == len(one) and report["summaries"]["parsed"] == 0


def test_summarize_under_torchrun_splits_the_files_between_ranks(logdir, tmp_path):
    one = foreign_copy(logdir, tmp_path / "one")
    two = foreign_copy(logdir, tmp_path / "two")
    assert summarize(str(tmp_path / "one")).returncode == 0
    proc = helpers.torchrun(SUMMARIZE, 2, str(tmp_path / "two"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = len(two)
    assert f"rank 0 of 2 summarises {(total + 1) // 2} of {total} traces" in proc.stderr
    assert f"rank 1 of 2 summarises {total // 2} of {total} traces" in proc.stderr
    assert f"{total} summaries written, 0 kept (still matching), 0 failed, of {total} traces " \
           "over 2 ranks" in proc.stdout
    assert summaries_of(one) == summaries_of(two)


PUBLIC = sorted(p for d in ("gpu-traces", "hta-traces", "kineto-traces")
                for p in (Path(__file__).parent / "data" / d).glob("*.gz")
                if p.stat().st_size < 1 << 20)


@pytest.mark.parametrize("source", PUBLIC, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_public_trace_reports_the_same_from_its_summary(source, tmp_path):
    """GPU breakdowns, diagnoses and throughput survive the summary (what it leaves out, the
    GPU's busy intervals, only the per-step shares read, and those are in it)."""
    trace = tmp_path / source.name
    shutil.copy2(source, trace)
    assert summarize(str(tmp_path)).returncode == 0
    from_summary = build_report(locate_run(trace))
    assert from_summary["summaries"]["read"] == 1
    from_trace = build_report(locate_run(trace), summaries=False)
    assert json.loads(json.dumps(comparable(from_summary))) == \
        json.loads(json.dumps(comparable(from_trace)))


def test_summarize_as_an_srun_step_meets_in_the_directory(logdir, tmp_path):
    """Two processes with an srun step's variables and no MASTER_ADDR: they split the files and
    meet through a file in the directory (gone afterwards)."""
    one = foreign_copy(logdir, tmp_path / "one")
    two = foreign_copy(logdir, tmp_path / "two")
    assert summarize(str(tmp_path / "one")).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT",
                                                              "RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, "-m", "profcallbacks.cli", "summarize",
                               str(tmp_path / "two")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**env, "SLURM_PROCID": str(r), "SLURM_STEP_NUM_TASKS": "2",
                                   "SLURM_NTASKS": "2", "SLURM_JOB_ID": "4242",
                                   "SLURM_STEP_ID": "0", "OMP_NUM_THREADS": "1"})
             for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    total = len(two)
    assert f"{total} summaries written" in outs[0][0] and "over 2 ranks" in outs[0][0]
    assert outs[1][0] == ""  # the totals are rank 0's to print
    assert summaries_of(one) == summaries_of(two)
    assert not list((tmp_path / "two").glob(".profcallbacks-summarize-*"))


def test_summarize_refuses_a_bad_call(tmp_path):
    done = summarize(str(tmp_path), "--processes", "0")
    assert done.returncode == 2 and "--processes must be at least 1, got 0" in done.stderr
    done = summarize(str(tmp_path / "missing"))
    assert done.returncode == 2 and "no such file or directory" in done.stderr
