"""`profcallbacks report` and `compare` on log directories written by real runs, and on bad input."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profcallbacks.cli import main
from profcallbacks.report import SCHEMA_VERSION
from report_runs import NASTY, plain_run, two_rank_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plain_run(tmp_path_factory.mktemp("report") / "slow")


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plain_run(tmp_path_factory.mktemp("report") / "fast", delay_s=0.0, nasty=False)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what training printed (the HF Trainer prints its logs)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def report_json(capsys: pytest.CaptureFixture[str], logdir: Path) -> dict[str, Any]:
    code, out, err = cli(capsys, "report", str(logdir), "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_text_report_of_a_real_plain_loop(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "report", str(run))
    assert code == 0 and err == ""
    for section in ("Step time (whole run", "Breakdown of the traced steps", "Captures",
                    "Top CPU operators by self time", "Findings"):
        assert section in out
    assert re.search(r"step000005-schedule +schedule +5-7", out)  # columns widen with the rows
    assert "step000018-manual" in out and "manual" in out
    assert "aten::addmm" in out and "enumerate(DataLoader)#" in out
    assert "sync_point (info): 1 finding(s)" in out and "advice:" in out
    assert "steps 0-29 (30 steps)" in out


def test_json_schema(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The documented schema (docs/reference/report-schema.md): names, types and the values of a real run."""
    report = report_json(capsys, run)
    assert report["schema_version"] == SCHEMA_VERSION == 3
    assert set(report) >= {"schema_version", "generator", "logdir", "world_size", "ranks", "steps",
                           "breakdown", "captures", "top_operators", "findings", "findings_by_kind",
                           "problems", "readable", "diagnoses"}
    assert all(set(c) >= {"diagnoses", "throughput"} for c in report["captures"])
    assert report["ranks"] == [0] and report["world_size"] == 1 and report["problems"] == []

    steps = report["steps"]
    assert (steps["steps"], steps["first_step"], steps["last_step"]) == (30, 0, 29)
    assert steps["median_ms"] <= steps["max_ms"] and steps["mean_ms"] <= steps["max_ms"]
    assert 0 < steps["data_wait_share"] < 1
    assert [r["rank"] for r in steps["per_rank"]] == [0]
    assert [(i["first_step"], i["last_step"]) for i in steps["intervals"]] == [
        (s, s + 4) for s in range(0, 30, 5)]

    bd = report["breakdown"]
    assert bd["steps"] == 5 == len(bd["per_step"])
    assert [s["step"] for s in bd["per_step"]] == [5, 6, 7, 18, 19]
    assert bd["data_wait_ms"] + bd["compute_ms"] + bd["other_ms"] == pytest.approx(bd["step_ms"])
    assert bd["data_wait_ms"] > 0 and bd["compute_ms"] > 0 and bd["gpu_kernel_ms"] is None

    assert [(c["directory"], c["trigger"], c["steps"], c["partial"]) for c in report["captures"]] == [
        ("step000005-schedule", "schedule", [5, 6, 7], False),
        ("step000018-manual", "manual", [18, 19], False)]
    for capture in report["captures"]:
        (file,) = capture["files"]
        assert file["path"].startswith(capture["directory"] + "/rank0_")
        assert file["path"].endswith(".pt.trace.json.gz") and file["bytes"] > 0
        assert file["rank"] == 0 and file["readable"] is True

    cpu = report["top_operators"]["cpu"]
    assert cpu and set(cpu[0]) == {"name", "calls", "self_ms", "total_ms", "self_ms_per_step"}
    assert [o["self_ms"] for o in cpu] == sorted((o["self_ms"] for o in cpu), reverse=True)
    assert all(o["self_ms"] <= o["total_ms"] + 1e-9 for o in cpu)
    assert report["top_operators"]["gpu"] == []

    sync = [f for f in report["findings"] if f["kind"] == "sync_point"]
    assert sync == [{"kind": "sync_point", "step": 12, "rank": 0, "severity": "info", "message": NASTY,
                     "details": {"location": "train.py:12", "op": "<aten::item>"}}]
    for finding in report["findings"]:
        assert set(finding) == {"kind", "step", "rank", "severity", "message", "details"}
    group = next(g for g in report["findings_by_kind"] if g["kind"] == "sync_point")
    assert group["count"] == 1 and group["ranks"] == [0] and group["advice"]


def test_two_ranks_merged_with_a_straggler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logdir = two_rank_run(tmp_path / "ddp", slow_rank=1)
    report = report_json(capsys, logdir)
    assert report["ranks"] == [0, 1] and report["world_size"] == 2
    steps = report["steps"]
    assert [r["rank"] for r in steps["per_rank"]] == [0, 1]
    assert steps["slowest_rank"] == 1
    assert steps["data_wait_share_spread"] > 0.2
    assert [s["rank"] for s in steps["stragglers"]] == [1]
    for capture in report["captures"]:
        assert sorted(f["rank"] for f in capture["files"]) == [0, 1]
    code, out, _ = cli(capsys, "report", str(logdir))
    assert code == 0 and "Per rank" in out and "slowest rank: 1" in out and "straggler: rank 1" in out


def test_a_rank_that_starts_late_never_publishes_or_removes_its_siblings_files(
        tmp_path: Path) -> None:
    # rank 0 starts only once rank 1 staged a capture: its start (it finishes what a killed run
    # left in staging) must not take rank 1's files for leftovers, and each capture is
    # published once, whole, with both ranks' files (merged: never a directory with one)
    outputs: list[str] = []
    logdir = two_rank_run(tmp_path / "ddp", slow_rank=1, first=1, outputs=outputs)
    captures = sorted(p for p in logdir.iterdir() if p.name.startswith("step"))
    assert [c.name for c in captures] == ["step000005-schedule", "step000018-manual"]
    for capture in captures:
        names = sorted(p.name for p in capture.iterdir())
        assert [n.split("_")[0] for n in names if n.endswith(".pt.trace.json.gz")] \
            == ["rank0", "rank1"], names
        assert any(n.startswith("all-ranks.") for n in names), names  # merged: published whole
    for text in outputs:
        assert "earlier run" not in text and "ranks' traces" not in text, text[-2000:]
    assert not (logdir / ".profcallbacks-staging").exists()


def test_compare_two_runs(run: Path, fast_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "compare", str(run), str(fast_run))
    assert code == 0, err
    assert "data-wait share" in out and "CPU operators" in out and "sync_point: 1 -> 0 (gone)" in out
    code, out, _ = cli(capsys, "compare", str(run), str(fast_run), "--format", "json")
    cmp = json.loads(out)
    assert cmp["schema_version"] == 3 and cmp["a"] == str(run) and cmp["b"] == str(fast_run)
    share = cmp["steps"]["data_wait_share"]
    assert share["b"] < share["a"] and share["delta"] == pytest.approx(share["b"] - share["a"])
    loader = next(o for o in cmp["operators"]["cpu"] if o["name"].startswith("enumerate(DataLoader)"))
    assert loader["delta_ms"] < 0
    assert {"kind": "sync_point", "count_a": 1, "count_b": 0, "status": "gone"} in cmp["findings"]


# --- bad input -------------------------------------------------------------------------------

def _copy(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    trace = sorted(copy.glob("step000005-schedule/*.pt.trace.json.gz"))[0]
    return copy, trace


@pytest.mark.parametrize("damage, reason", [
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "truncated gzip"),
    (lambda p: p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X",')), "invalid JSON"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_bytes(b"not gzip at all"), "not a gzip file"),
    (lambda p: p.write_bytes(gzip.compress(b'{"hello": 1}')), "not a Chrome trace"),
])
def test_a_damaged_trace_is_named_and_the_rest_reported(run: Path, tmp_path: Path, damage: Any,
                                                        reason: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    logdir, trace = _copy(run, tmp_path)
    damage(trace)
    code, out, err = cli(capsys, "report", str(logdir))
    assert code == 0
    assert f"skipped {trace}: {reason}" in err and "Traceback" not in err
    assert "step000018-manual" in out and "aten::addmm" in out  # the rest is still there
    assert reason in out  # also listed under "Files that could not be read"


def test_a_cut_jsonl_line_is_skipped(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logdir, _ = _copy(run, tmp_path)
    steps_file = logdir / "profcallbacks" / "rank0.steps.jsonl"
    steps_file.write_text(steps_file.read_text() + '{"rank": 0, "first_st')
    report = report_json(capsys, logdir)
    assert report["steps"]["steps"] == 30
    assert report["problems"] == [{"file": str(steps_file), "error": "skipped 1 unreadable line(s): 7"}]


def test_nothing_readable_exits_non_zero(run: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    logdir, _ = _copy(run, tmp_path)
    shutil.rmtree(logdir / "profcallbacks")
    for trace in logdir.glob("step*/*.pt.trace.json.gz"):
        trace.write_bytes(b"")
    code, out, err = cli(capsys, "report", str(logdir))
    assert code == 1
    assert err.count("empty file") == 2 and f"nothing in {logdir} could be read" in err
    assert "Traceback" not in err


def test_missing_path_and_directory_without_run(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "report", str(tmp_path / "nope"))
    assert code == 2 and out == "" and f"{tmp_path / 'nope'}: no such file or directory" in err
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    code, out, err = cli(capsys, "report", str(tmp_path / "empty"))
    assert code == 2 and "no profcallbacks run here" in err
    code, _, err = cli(capsys, "compare", str(tmp_path / "empty"), str(tmp_path / "nope"))
    assert code == 2 and "no profcallbacks run here" in err


def test_installed_command_without_traceback(tmp_path: Path) -> None:
    """The real entry point in a fresh process: a clear message, no traceback."""
    exe = shutil.which("profcallbacks")
    cmd = [exe] if exe else [sys.executable, "-m", "profcallbacks.cli"]
    result = subprocess.run([*cmd, "report", str(tmp_path / "missing")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no such file or directory" in result.stderr


def test_parent_directory_with_one_run_is_found(run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(run, tmp_path / "output" / "runs" / "exp1")
    report = report_json(capsys, tmp_path / "output")
    assert report["logdir"] == str(tmp_path / "output" / "runs" / "exp1")
    shutil.copytree(run, tmp_path / "output" / "runs" / "exp2")
    code, out, err = cli(capsys, "report", str(tmp_path / "output"))
    assert code == 0 and "holds 2 runs" in out and "runs/exp2" in out  # one headline per run


# --- Lightning and Hugging Face runs ---------------------------------------------------------

def _check_framework_report(report: dict[str, Any], steps: int) -> None:
    assert report["problems"] == [] and report["readable"]
    assert report["steps"]["steps"] == steps
    ((capture),) = report["captures"]
    assert capture["trigger"] == "schedule" and capture["steps"] == [3, 4, 5]
    assert report["breakdown"]["steps"] == 3 and report["breakdown"]["compute_ms"] > 0
    names = [o["name"] for o in report["top_operators"]["cpu"]]
    assert any(n in names for n in ("aten::addmm", "aten::mm", "aten::linear"))


def test_report_of_a_real_lightning_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from profcallbacks import Schedule
    from profcallbacks.lightning import ProfilerCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = ProfilerCallback(tmp_path / "pl", schedule=Schedule(skip_first=2, warmup=1, active=3),
                                log_every_n_steps=4, tensorboard_scalars=False, watch_capture_file=False)
    trainer = pl.Trainer(max_steps=12, logger=False, enable_checkpointing=False, accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=4))
    _check_framework_report(report_json(capsys, tmp_path / "pl"), steps=12)


def test_report_of_a_real_hf_trainer_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    import importlib.util

    from profcallbacks import Schedule
    from profcallbacks.hf import ProfilerCallback

    spec = importlib.util.spec_from_file_location(
        "hf_example", Path(__file__).resolve().parents[1] / "examples" / "hf_example.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    callback = ProfilerCallback(tmp_path / "hf", schedule=Schedule(skip_first=2, warmup=1, active=3),
                                log_every_n_steps=4, tensorboard_scalars=False, watch_capture_file=False)
    args = example.training_args(str(tmp_path / "out"), max_steps=12)
    transformers.Trainer(model=example.TinyRegressor(), args=args,
                         train_dataset=example.SyntheticRegression(256), callbacks=[callback]).train()
    _check_framework_report(report_json(capsys, tmp_path / "hf"), steps=12)
