"""`compare` as a CI gate on real CPU runs, its full operator tables, and `report` of several runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from profcallbacks.cli import main
from profcallbacks.report import compare_reports
from watch_train import train


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real CPU runs: ``base`` (2 ms of work per step), ``slow`` (6 ms more per step), ``stalled``
    (a slow loader: a dataloader-stall finding), and two runs of 20 steps."""
    root = tmp_path_factory.mktemp("gate")
    train(root / "base", steps=150, sleep_s=0.002, delay_s=0.0, log_every=10)
    train(root / "slow", steps=150, sleep_s=0.008, delay_s=0.0, log_every=10)
    train(root / "stalled", steps=60, sleep_s=0.0, delay_s=0.001, log_every=10)
    for name in ("short_a", "short_b"):
        train(root / name, steps=20, sleep_s=0.002, delay_s=0.0, log_every=5)
    return {p.name: p for p in root.iterdir()}


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_slower_run_fails_the_gate(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "compare", runs["base"], runs["slow"], "--fail-if-slower", "20",
                         "--format", "json")
    assert code == 1, err
    verdict = err.strip().splitlines()[-1]
    assert verdict.startswith("regression: median step time +") and verdict.split()[5] == ">"
    gate = json.loads(out)["gate"]
    assert {"metric", "base", "new", "change", "threshold", "failed"} <= set(gate)
    assert gate["metric"] == "median_step" and gate["failed"] and gate["threshold"] == 20
    assert gate["new"] > gate["base"] and gate["change"] == pytest.approx(
        (gate["new"] / gate["base"] - 1) * 100)
    assert gate["change"] > 100  # 2 ms -> 8 ms of sleep per step


def test_a_faster_or_equal_run_passes(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "compare", runs["slow"], runs["base"], "--fail-if-slower", "5")
    assert code == 0 and err.strip().splitlines()[-1].startswith("ok: median step time -")
    code, out, err = cli(capsys, "compare", runs["base"], runs["base"], "--fail-if-slower", "5",
                         "--metric", "mean_step", "--format", "json")
    assert code == 0 and "ok: mean step time +0.0% <= 5%" in err
    assert json.loads(out)["gate"]["change"] == 0.0


def test_too_short_runs_are_refused(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "compare", runs["short_a"], runs["short_b"], "--fail-if-slower", "5",
                         "--format", "json")
    assert code == 2
    assert f"refused: BASE ({runs['short_a']}) has 20 steps; a comparison needs at least 100" in err
    assert json.loads(out)["gate"]["refused"]
    code, _, err = cli(capsys, "compare", runs["base"], runs["short_b"], "--fail-if-slower", "5")
    assert code == 2 and "NEW (" in err
    code, _, err = cli(capsys, "compare", runs["short_a"], runs["short_b"], "--fail-if-slower", "5",
                       "--min-steps", "20")
    assert code == 2 and "has 4 step summaries; the median needs at least 5" in err
    code, _, err = cli(capsys, "compare", runs["base"], runs["slow"], "--fail-if-slower", "5",
                       "--metric", "traced_step")
    assert code == 1 and "traced step time" in err  # three captures of three steps each
    code, _, err = cli(capsys, "compare", runs["base"], runs["base"] / "missing", "--fail-if-slower", "5")
    assert code == 2 and "refused" in err


def test_new_findings_and_data_wait_share(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "compare", runs["base"], runs["stalled"], "--fail-on-new-findings",
                         "dataloader_stall,straggler", "--format", "json")
    assert code == 1 and "regression: new findings: dataloader_stall" in err
    assert json.loads(out)["gate"]["new_findings"] == ["dataloader_stall"]
    code, _, err = cli(capsys, "compare", runs["stalled"], runs["base"], "--fail-on-new-findings", "any")
    assert code == 0 and "ok: no new findings of any" in err
    code, _, err = cli(capsys, "compare", runs["stalled"], runs["stalled"], "--fail-on-new-findings", "any")
    assert code == 0 and "ok: no new findings" in err  # a kind both runs have is not new
    code, _, err = cli(capsys, "compare", runs["base"], runs["stalled"], "--fail-if-slower", "10",
                       "--metric", "data_wait_share", "--min-steps", "50")
    assert code == 1 and "regression: data-wait share +" in err and "pts > 10 pts" in err


def test_operators_come_from_the_full_tables(runs: dict[str, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """With --top 2 the rows are the 2 biggest changes of the full tables: no operator is called
    new or gone for crossing a cut-off (the stalled run's top operator is the DataLoader's, the base
    run's the matmuls), and each value is the full table's."""
    full = {}
    for name in ("base", "stalled"):
        code, out, _ = cli(capsys, "report", runs[name], "--format", "json", "--top", "1000")
        full[name] = {o["name"]: o["self_ms_per_step"] for o in json.loads(out)["top_operators"]["cpu"]}
    code, out, _ = cli(capsys, "compare", runs["base"], runs["stalled"], "--top", "2", "--format", "json")
    rows = json.loads(out)["operators"]["cpu"]
    assert code == 0 and len(rows) == 2
    for row in rows:
        assert row["self_ms_per_step_a"] == full["base"].get(row["name"])
        assert row["self_ms_per_step_b"] == full["stalled"].get(row["name"])
        assert row["status"] == ("new" if row["name"] not in full["base"] else
                                 "gone" if row["name"] not in full["stalled"] else "changed")
    changes = sorted((abs(full["stalled"].get(n, 0) - full["base"].get(n, 0)) for n in
                      full["base"].keys() | full["stalled"].keys()), reverse=True)
    assert [abs(r["delta_ms"]) for r in rows] == pytest.approx(changes[:2])


def _with_verdict(report: dict[str, Any], kind: str, idle: float) -> dict[str, Any]:
    report = dict(report, verdict={"kind": kind, "share": 0.6, "evidence": [], "advice": []})
    report["captures"] = [dict(c, files=[dict(f, gpu_breakdown={
        "idle_share": idle, "compute_share": 1 - idle, "non_compute_share": 0.0,
        "comm_overlap_share": 0.0}) for f in c["files"]]) for c in report["captures"]]
    return report


def test_verdicts_and_gpu_breakdown_shares_are_compared(runs: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from profcallbacks.report import render_compare_text

    reports = {}
    for name in ("base", "slow"):
        reports[name] = json.loads(cli(capsys, "report", runs[name], "--format", "json")[1])
    cmp = compare_reports(_with_verdict(reports["base"], "gpu_compute_bound", 0.1),
                          _with_verdict(reports["slow"], "host_bound", 0.4))
    assert cmp["verdict"]["a"]["kind"] == "gpu_compute_bound" and cmp["verdict"]["b"]["kind"] == "host_bound"
    assert cmp["gpu_breakdown"]["idle_share"]["delta"] == pytest.approx(0.3)
    text = render_compare_text(cmp)
    assert "Verdict: gpu_compute_bound (60%) -> host_bound (60%)" in text
    assert "+30.0 pts" in text
    plain = render_compare_text(compare_reports(reports["base"], reports["slow"]))
    assert "GPU time breakdown" not in plain  # CPU runs: a verdict, but no GPU shares


def test_report_of_several_runs_lists_each(runs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("base", "stalled"):
        shutil.copytree(runs[name], tmp_path / "all" / name)
    code, out, err = cli(capsys, "report", tmp_path / "all")
    assert code == 0, err
    assert "holds 2 runs" in out
    base_line = next(line for line in out.splitlines() if line.strip().startswith("base "))
    stalled_line = next(line for line in out.splitlines() if line.strip().startswith("stalled "))
    assert base_line.split()[1] == "150" and stalled_line.split()[1] == "60"
    # findings: one capture_verdict per capture in both runs, and the stall
    def captures(name: str) -> int:
        return sum(1 for d in (tmp_path / "all" / name).iterdir() if d.name.startswith("step"))

    assert int(stalled_line.split()[-1]) == captures("stalled") + 1
    assert int(base_line.split()[-1]) == captures("base")
    code, out, _ = cli(capsys, "report", tmp_path / "all", "--format", "json")
    rows = json.loads(out)["runs"]
    assert code == 0 and [r["steps"] for r in rows] == [150, 60]
    assert rows[0]["median_ms"] > 0 and rows[1]["findings"] == captures("stalled") + 1
    assert rows[0]["captures"] == captures("base")  # the automatic baseline included
