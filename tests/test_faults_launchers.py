"""Launcher variables: ranks come from the process group when there is one; variables without
one that are no complete launcher set (a Slurm batch script, a stray RANK) give one warning and
the run goes on as one rank."""

from __future__ import annotations

import logging
import socket
import time

import pytest
import torch.distributed as dist

from helpers import captured_steps, tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
from profcallbacks.core.ranks import RankInfo

VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
        "SLURM_STEP_NUM_TASKS")


@pytest.fixture
def launcher_env(monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize("env", [
    {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"},  # sbatch --ntasks=4: the script runs once
    {"RANK": "1"},
    {"WORLD_SIZE": "2", "SLURM_PROCID": "3"},
])
def test_launcher_variables_without_a_process_group_run_as_one_rank(tmp_path, caplog,
                                                                    launcher_env, env):
    launcher_env(**env)
    model, opt = tiny_model()
    with caplog.at_level(logging.WARNING):
        prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=0, active=2, repeat=1),
                            stall=None, slowdown=None, sync_audit=False, memory=None)
        StepProfiler(tmp_path / "second", schedule=None)  # the same environment: no second warning
        started = time.monotonic()
        with prof:
            for _ in range(6):
                train_step(model, opt)
                prof.step()
        close_s = time.monotonic() - started
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    named = [w for w in warnings if "single rank" in w]
    assert len(named) == 1 and all(f"{k}={v}" in named[0] for k, v in env.items()), warnings
    assert prof.session.rank == RankInfo(0, 0, 1, prof.session.rank.host)
    assert not [w for w in warnings if "ranks' traces" in w or "not initialised" in w], warnings
    assert captured_steps(tmp_path) == {"step000002-schedule": [2, 3]}
    assert close_s < 20  # never waits for ranks that do not exist (30 s before)


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 1, 2)),  # torchrun, before init
    ({"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
      "SLURM_LOCALID": "0"}, (2, 0, 4)),  # an srun step
    ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, (0, 0, 1)),
])
def test_complete_launcher_sets_are_trusted(caplog, launcher_env, env, expected):
    launcher_env(**env)
    with caplog.at_level(logging.WARNING):
        rank = RankInfo.detect()
    assert (rank.rank, rank.local_rank, rank.world_size) == expected
    assert "single rank" not in caplog.text


def test_the_process_group_wins_over_launcher_variables(caplog, launcher_env):
    launcher_env(RANK="1", WORLD_SIZE="8", SLURM_NTASKS="4")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with caplog.at_level(logging.WARNING):
            rank = RankInfo.detect()
    finally:
        dist.destroy_process_group()
    assert (rank.rank, rank.world_size) == (0, 1)
    assert "single rank" not in caplog.text
