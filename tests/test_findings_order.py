"""Findings read in step order: a capture's verdict the export helper makes after later steps
(here after a stall at step 28) says in the live log and the findings file when it came, and
``watch`` and ``report`` list it at its own step."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import pytest

from profcallbacks import ProfilerConfig, ProfilingSession, StallConfig
from profcallbacks.cli import main
from profcallbacks.core.ranks import RankInfo
from profcallbacks.detect.base import Participant
from profcallbacks.findings import CAPTURE_VERDICT, DATALOADER_STALL, Finding
from profcallbacks.layout import findings_file
from profcallbacks.report import build_report, locate_run
from profcallbacks.run.defaults import default_detectors
from profcallbacks.testing import FakeClock
from profcallbacks.watch.view import in_step_order


class LateVerdict(Participant):
    """Hands over a verdict for step ``of`` with the findings taken after the block that ends
    at ``after`` (as the export helper does once a capture's trace is analysed)."""

    def __init__(self, of: int, after: int) -> None:
        self.of, self.after, self._due = of, after, False

    def observe_block(self, first: int, times: list[float], waits: list[float], captured: bool,
                      after_pause: bool) -> Iterable[Finding]:
        self._due = self._due or first <= self.after < first + len(times)
        return ()

    def take_findings(self) -> Iterable[Finding]:
        if not self._due:
            return ()
        self._due, self.after = False, -1
        return [Finding(CAPTURE_VERDICT, self.of, 0, "info", "capture step000022-schedule: "
                        "input_bound (40%)", {"capture": "step000022-schedule"})]


@pytest.fixture
def run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Path, list[Finding], list[str]]:
    """40 steps of 10 ms, from step 17 on with 10 ms of data wait each (a stall alerted at step 28,
    the window alone deciding) and a verdict for step 24 handed over after the block of step 30."""
    clock = FakeClock()
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, watch_capture_file=False,
                            slowdown=None, sync_audit=False, memory=None,
                            stall=StallConfig(min_duration_s=0))
    rank = RankInfo(rank=0, local_rank=0, world_size=1, host="test-host")
    session = ProfilingSession(config, tmp_path, rank=rank, clock=clock,
                               detectors=[*default_detectors(config, rank), LateVerdict(24, 30)])
    with caplog.at_level(logging.INFO, logger="profcallbacks"):
        session.open()
        for step in range(40):
            clock.now += 0.010 if step >= 17 else 0.0
            session.data_wait(0.010 if step >= 17 else 0.0)
            clock.now += 0.010
            session.step_end()
        session.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "profcallbacks"]
    return tmp_path, session.findings, logged


def test_a_late_verdict_says_in_the_log_and_the_file_when_it_came(run):
    logdir, findings, logged = run
    kinds = [(f.kind, f.step) for f in findings if f.kind in (DATALOADER_STALL, CAPTURE_VERDICT)]
    assert kinds == [(DATALOADER_STALL, 28), (CAPTURE_VERDICT, 24)]  # the order they came in
    verdict = next(f for f in findings if f.kind == CAPTURE_VERDICT)
    assert verdict.reported_at_step is not None and verdict.reported_at_step >= 30
    stall = next(f for f in findings if f.kind == DATALOADER_STALL)
    assert stall.reported_at_step is None and "reported_at_step" not in stall.details  # in order
    (line,) = [m for m in logged if "capture_verdict" in m]
    assert line.startswith(f"[rank 0 step 24, reported at step {verdict.reported_at_step}]")
    rows = [json.loads(r) for r in findings_file(logdir, 0).read_text().splitlines()]
    assert [r["details"].get("reported_at_step") for r in rows if r["kind"] == CAPTURE_VERDICT] == [
        verdict.reported_at_step]


def test_watch_and_report_list_findings_in_step_order(run, capsys):
    logdir, _, _ = run
    capsys.readouterr()
    assert main(["watch", str(logdir), "--once"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("Findings (latest step first)"):]
    assert table.index("dataloader_stall") < table.index("capture_verdict")  # 28, then 24
    steps = [f["step"] for f in build_report(locate_run(logdir))["findings"]]
    assert steps == sorted(steps) and steps.index(24) < steps.index(28)


def test_in_step_order_keeps_the_runs_of_a_directory_apart():
    """A run started again in the same directory (its steps from 0 again) stays above the first."""
    rows = [{"run": "a", "step": 50}, {"run": "a", "step": 40}, {"run": "b", "step": 3},
            {"run": "b", "step": 1}, {"run": "b", "step": 3, "kind": "second"}]
    assert [(r["run"], r["step"], r.get("kind")) for r in in_step_order(rows)] == [
        ("b", 3, "second"), ("b", 3, None), ("b", 1, None), ("a", 50, None), ("a", 40, None)]
