"""The live ``slowdown_diagnosis`` of two real captures: it blames nothing when the slow capture
was not slower, and what it says grew is what ``compare`` of the same two captures says grew."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch

from helpers import capture_dirs, trace_files
from profcallbacks import Schedule, StepProfiler
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.triggers import BASELINE, SLOWDOWN
from profcallbacks.findings import SLOWDOWN_DIAGNOSIS
from profcallbacks.report.build import build_report, locate_run
from profcallbacks.report.capture_findings import capture_findings
from profcallbacks.report.compare import ALL_OPERATORS, compare_reports

WINDOWS = Schedule(skip_first=2, wait=3, warmup=1, active=3, repeat=2)  # steps 6-8 and 13-15


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a loaded 2-core machine two threads wait on each other (a 96x96
    matmul took 8 ms instead of 0.01 ms), drowning the step shapes these tests compare."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def two_captures(tmp_path: Path, *, first_sleep_s: float, second_matmuls: int,
                 copy: bool) -> tuple[Path, Path]:
    """A loop whose first window sleeps ``first_sleep_s`` per step beside 2 matmuls and whose
    second window runs ``second_matmuls`` matmuls (and a transposed copy with ``copy``): its two
    capture directories."""
    a, b, big = torch.randn(96, 96), torch.randn(96, 96), torch.randn(512, 512)
    prof = StepProfiler(tmp_path / "run", schedule=WINDOWS, tensorboard_scalars=False, slowdown=None,
                        stall=None, memory=None, sync_audit=False, watch_capture_file=False)
    with prof:
        for step in range(17):
            second = step >= 10
            for _ in range(second_matmuls if second else 2):
                a @ b
            if second and copy:
                big.t().contiguous()  # grew: a copy the first window did not make
            elif not second and first_sleep_s:
                time.sleep(first_sleep_s)  # the machine took the core: the step waits
            prof.step()
    first, second = capture_dirs(tmp_path / "run")
    return first, second


def diagnosis_of(baseline: Path, slow: Path):
    """Replays the live analysis: the baseline capture, then the slowdown capture."""
    history: list = []
    findings = []
    for capture, trigger in ((baseline, BASELINE), (slow, SLOWDOWN)):
        info = CaptureInfo(capture.name, trigger, 0, (), False, 0, 0, RankInfo.detect())
        [trace] = trace_files(capture)
        findings += capture_findings(trace, info, history)
    return [f for f in findings if f.kind == SLOWDOWN_DIAGNOSIS]


def test_a_slow_capture_faster_than_its_baseline_blames_no_operator(tmp_path):
    """The machine was slow during the baseline, not during the alert's capture (11.92 -> 8.07
    ms once read 'grew most: aten::t'): there is no growth in the capture to explain."""
    baseline, slow = two_captures(tmp_path, first_sleep_s=0.01, second_matmuls=3, copy=True)
    [diagnosis] = diagnosis_of(baseline, slow)
    assert "grew most" not in diagnosis.message and "aten::" not in diagnosis.message, diagnosis
    details = diagnosis.details
    before_ms, after_ms = details["before_step_ms"], details["after_step_ms"]
    assert after_ms < before_ms, details
    assert details["changes"] == [] and details["growth"]["pattern"] == "none"
    assert "not slower than" in diagnosis.message and diagnosis.severity == "info"


def test_what_the_diagnosis_says_grew_is_what_compare_says_grew(tmp_path):
    baseline, slow = two_captures(tmp_path, first_sleep_s=0.0, second_matmuls=200, copy=False)
    [diagnosis] = diagnosis_of(baseline, slow)
    grown_ops = [c for c in diagnosis.details["changes"] if c["what"].startswith("aten::")]
    assert grown_ops[0]["what"] in diagnosis.message
    reports = []
    for capture in (baseline, slow):  # each capture on its own, as `profcallbacks compare A B`
        alone = tmp_path / capture.name
        shutil.copytree(capture, alone / capture.name)
        reports.append(build_report(locate_run(alone), top=ALL_OPERATORS))
    rows = compare_reports(*reports, top=ALL_OPERATORS)["operators"]["cpu"]
    grown = sorted((r for r in rows if r["delta_ms"] > 0), key=lambda r: -r["delta_ms"])
    assert grown[0]["name"] == grown_ops[0]["what"] == "aten::mm", (grown[:3], grown_ops[:3])
    by_name = {r["name"]: r for r in rows}
    for change in grown_ops[:3]:  # the same per-step self times on both sides
        row = by_name[change["what"]]
        assert abs((row["self_ms_per_step_a"] or 0.0) - change["before_ms"]) < 1e-6
        assert abs((row["self_ms_per_step_b"] or 0.0) - change["after_ms"]) < 1e-6
