"""Issue 17 item 1: a full or read-only disk never reaches training; sinks recover when it clears."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from faults_helpers import SmallDisk, small_disk_fixture  # noqa: F401  (the small_disk fixture)
from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
from profcallbacks.core.faults import RecoveringAppender
from profcallbacks.findings import Finding, FindingsFile
from profcallbacks.layout import STAGING_DIR
from profcallbacks.run import blocks, sinks


@pytest.fixture(autouse=True)
def steps_file_writes_every_summary(monkeypatch):
    """These runs last under a second: each step ends a block and each summary is written at
    once, so the faults meet writes whatever the machine's speed.

    Blocks of 0.25 s held the rows of steps 90-199 of one run until after the disk was freed; a
    full tmpfs still takes appends into a page the file holds, so the stretch's rows that were
    written (under 4 KiB) met no fault, and no warning came (whole-suite run beside two CPU
    burners). Written step by step, the stretch's 17 rows (~400 bytes each) pass a page's end."""
    monkeypatch.setattr(sinks, "STEPS_FLUSH_S", 0.0)
    monkeypatch.setattr(blocks, "BLOCK_S", 0.0)


def _run(disk: SmallDisk, fault_on, fault_off, *, steps: int = 250) -> tuple[int, list[str]]:
    """Trains ``steps`` steps with the fault from step 30 to 200; returns steps done and warnings."""
    logdir = disk.root / "run"
    model, opt = tiny_model()
    schedule = Schedule(skip_first=60, warmup=0, active=2, repeat=1)  # a capture while faulty
    done = 0
    with StepProfiler(logdir, schedule=schedule, log_every_n_steps=10, stall=None,
                      slowdown=None, sync_audit=False) as prof:
        for step in range(steps):
            if step == 30:
                fault_on()
            if step == 200:
                fault_off()
            train_step(model, opt)
            prof.step()
            done += 1
    return done, []


def _rows(disk: SmallDisk) -> list[dict]:
    path = disk.root / "run" / "profcallbacks" / "rank0.steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_disk_full_mid_run_warns_once_recovers_and_never_raises(small_disk, caplog, capfd):
    with caplog.at_level(logging.WARNING):
        done, _ = _run(small_disk, small_disk.fill, small_disk.free)
    after_the_with_block = True  # where users save their model
    assert after_the_with_block and done == 250
    warnings = _warnings(caplog)
    steps_warnings = [w for w in warnings if "cannot write step summaries" in w]
    assert len(steps_warnings) == 1 and "disk full" in steps_warnings[0]
    assert any("could not export capture step000060" in w and "disk full" in w for w in warnings)
    assert any("step summaries" in w and "works again" in w for w in warnings)
    rows = _rows(small_disk)  # summaries of the full-disk stretch were kept and written later
    assert [r["last_step"] for r in rows] == list(range(9, 250, 10))
    assert "Exception in thread" not in capfd.readouterr().err
    staging = small_disk.root / "run" / STAGING_DIR  # kineto's half-written save removed too
    assert not staging.exists() or list(staging.iterdir()) == []


def test_a_file_size_limit_is_named_and_leaves_nothing_half_written(tmp_path):
    """``ulimit -f`` below a capture's size: kineto's save fails (EFBIG, and it leaves its
    ``trace.json.tmp``); the warning names the limit, training ends normally, staging is clean."""
    logdir = tmp_path / "run"
    script = (f"import resource, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (40000, resource.RLIM_INFINITY)); "
              "from faults_helpers import small_run; "
              f"small_run(__import__('pathlib').Path({str(logdir)!r}), 12, tensorboard_scalars=False); "
              "print('TRAINING-DONE')")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "TRAINING-DONE" in result.stdout, result.stderr[-2000:]
    assert "could not export capture step000002-schedule" in result.stderr
    assert "file size limit of 40000 bytes (ulimit -f)" in result.stderr
    staging = logdir / STAGING_DIR
    assert not staging.exists() or list(staging.iterdir()) == []


def test_read_only_mid_run_warns_once_recovers_and_never_raises(small_disk, caplog, capfd):
    with caplog.at_level(logging.WARNING):
        done, _ = _run(small_disk, lambda: small_disk.read_only(True),
                       lambda: small_disk.read_only(False))
    assert done == 250
    warnings = _warnings(caplog)
    steps_warnings = [w for w in warnings if "cannot write step summaries" in w]
    assert len(steps_warnings) == 1 and "read-only" in steps_warnings[0]
    assert any("could not export capture step000060" in w and "read-only" in w for w in warnings)
    assert [r["last_step"] for r in _rows(small_disk)] == list(range(9, 250, 10))
    assert "Exception in thread" not in capfd.readouterr().err


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_fault_at_close_does_not_raise(small_disk, caplog, capfd, fault):
    model, opt = tiny_model()
    schedule = Schedule(skip_first=15, warmup=0, active=10, repeat=1)  # still open at close
    with caplog.at_level(logging.WARNING), StepProfiler(small_disk.root / "run", schedule=schedule,
                                                        log_every_n_steps=7) as prof:
        for _ in range(20):
            train_step(model, opt)
            prof.step()
        small_disk.fill() if fault == "full" else small_disk.read_only(True)
    after_the_with_block = True
    assert after_the_with_block
    if fault == "read-only":  # (a full tmpfs still takes small appends into a page it holds)
        assert any("could not be written" in w and "step summaries" in w for w in _warnings(caplog))
    assert any("could not export capture step000015-schedule-partial" in w
               and ("disk full" if fault == "full" else "read-only") in w for w in _warnings(caplog))
    assert "Traceback" not in capfd.readouterr().err


def test_tensorboard_events_survive_a_read_only_stretch(small_disk, caplog, capfd, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = small_disk.root / "run"
    model, opt = tiny_model()
    monkeypatch.setattr(sinks, "TENSORBOARD_BATCH_S", 0.0)  # a batch is due at every summary,
    with caplog.at_level(logging.WARNING), StepProfiler(logdir, schedule=None,  # also read-only
                                                        log_every_n_steps=5) as prof:
        for step in range(40):
            if step == 10:
                small_disk.read_only(True)
            if step == 30:
                small_disk.read_only(False)
            train_step(model, opt)
            prof.step()
    tb_warnings = [w for w in _warnings(caplog) if "TensorBoard events" in w]
    assert len(tb_warnings) == 2 and "read-only" in tb_warnings[0]  # the episode and its end
    assert "works again" in tb_warnings[1]
    assert "Exception in thread" not in capfd.readouterr().err
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("profcallbacks/step_time_ms")]
    assert steps == list(range(4, 40, 5))  # every summary, none lost


def test_findings_file_keeps_findings_through_a_full_disk(small_disk, caplog):
    path = small_disk.root / "rank0.findings.jsonl"
    clock = [0.0]
    sink = FindingsFile(path)
    sink._out = RecoveringAppender(path, "findings", clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING):
        small_disk.fill()  # before the first line (a tmpfs page already held takes small appends)
        for step in range(1, 6):
            sink(Finding("step_slowdown", step=step, rank=0, severity="warning", message="b"))
            clock[0] += 10.0  # retries are due
        small_disk.free()
        sink(Finding("step_slowdown", step=6, rank=0, severity="warning", message="c"))
        sink.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    failures = [w for w in _warnings(caplog) if "cannot write findings" in w]
    assert len(failures) == 1 and "disk full" in failures[0]


@pytest.mark.parametrize("start_full", [True, False])
def test_a_half_written_record_is_truncated_away(small_disk, start_full):
    path = small_disk.root / "f.jsonl"
    out = RecoveringAppender(path, "rows", retry_s=0.0)
    out.append(b"first\n")
    small_disk.fill()
    out.append(b"x" * 100_000 + b"\n")  # cannot fit: nothing of it may stay in the file
    assert path.read_bytes() == b"first\n"
    small_disk.free()
    out.append(b"third\n")
    assert path.read_bytes() == b"first\n" + b"x" * 100_000 + b"\nthird\n"


class _FaultAt:
    """A dataset that switches a fault on at its ``on_at``-th fetch and off at its ``off_at``-th."""

    def __init__(self, on_at: int, off_at: int, on, off) -> None:
        from front_ends import SleepyDataset

        self._data = SleepyDataset(0.0)
        self._events = {on_at: on, off_at: off}
        self._fetched = 0

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, i: int):
        self._fetched += 1  # (the HF Trainer shuffles: count fetches, not indices)
        if self._fetched in self._events:
            self._events.pop(self._fetched)()
        return self._data[i]


@pytest.mark.parametrize("front_end", ["plain", "lightning", "hf"])
def test_every_front_end_survives_a_read_only_stretch(small_disk, caplog, front_end):
    from front_ends import FRONT_ENDS

    logdir = small_disk.root / "run"
    # fetches 20-300 (batches of 2): steps 10-150, longer than a block of steps (BLOCK_STEPS)
    dataset = _FaultAt(20, 300, lambda: small_disk.read_only(True),
                       lambda: small_disk.read_only(False))
    options = {"schedule": None, "log_every_n_steps": 5, "stall": None, "slowdown": None,
               "sync_audit": False}
    with caplog.at_level(logging.WARNING):
        FRONT_ENDS[front_end](logdir, dataset, 200, options)  # trainer.fit / train() return
    failures = [w for w in _warnings(caplog) if "cannot write step summaries" in w]
    assert len(failures) == 1 and "read-only" in failures[0]
    rows = [json.loads(line) for line in
            (logdir / "profcallbacks" / "rank0.steps.jsonl").read_text().splitlines()]
    assert sum(r["steps"] for r in rows) >= 198  # the read-only stretch's summaries were kept
