"""The files an srun step's ranks meet through: whole, read once, removed, and never another
owner's file or a link in their place (a shared log directory)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from profcallbacks.report.rank_meeting import collect, meeting_name, post


def test_rank_zero_waits_for_every_rank_and_leaves_nothing(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    for rank in (2, 0, 1):
        post(tmp_path, rank, [rank, "ok"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".profcallbacks-summarize-77.0.3.{r}" for r in range(3)]
    assert collect(tmp_path, 3) == {0: [0, "ok"], 1: [1, "ok"], 2: [2, "ok"]}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another owner's file needs root")
def test_a_planted_file_or_link_is_not_taken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    planted = tmp_path / meeting_name(1)
    planted.write_text("[999]")
    os.chown(planted, 12345, 12345)
    (tmp_path / meeting_name(2)).symlink_to("/etc/hostname")
    post(tmp_path, 0, [0])
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        assert collect(tmp_path, 3, wait_s=0.3) == {0: [0]}
    assert "no counts from rank(s) [1, 2]" in caplog.text
    assert planted.exists() and (tmp_path / meeting_name(2)).is_symlink()  # left as they were
    post(tmp_path, 1, [1])  # the rank's own file takes the name
    post(tmp_path, 2, [2])
    assert collect(tmp_path, 3, wait_s=0.3) == {1: [1], 2: [2]}
