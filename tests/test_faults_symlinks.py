"""A shared log directory with links planted by another user: nothing outside it is written,
truncated or deleted, and no planted link is followed (real symlinks, the real profiler)."""

from __future__ import annotations

import logging
import os
import socket
import stat
import time

import pytest

from helpers import captured_steps, load_trace, profiler_steps, tiny_model, train_step
from profcallbacks import Schedule, StepProfiler
from profcallbacks.core import safefs
from profcallbacks.layout import STAGING_DIR, findings_file, run_lock_file, steps_file, summary_file_name

HOST = socket.gethostname().split(".")[0]


def _train(logdir, steps=8, *, after_enter=None, **kwargs):
    model, opt = tiny_model()
    kwargs.setdefault("schedule", Schedule(skip_first=2, warmup=0, active=2, repeat=1))
    with StepProfiler(logdir, stall=None, slowdown=None, sync_audit=False, memory=None,
                      **kwargs) as prof:
        if after_enter is not None:
            after_enter(prof)
        for _ in range(steps):
            train_step(model, opt)
            prof.step()
    return prof


@pytest.fixture
def victim(tmp_path):
    """A directory outside the log directory, with files that must survive untouched."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    for name in ("model.pt", "optimizer.pt"):
        (root / name).write_bytes(b"precious " + name.encode())
    return root


def _contents(root):
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _old(path):
    old = time.time() - 3600
    os.utime(path, (old, old), follow_symlinks=False)


def test_recovery_never_deletes_through_a_staging_symlink(tmp_path, victim, caplog):
    logdir = tmp_path / "run"
    staging = logdir / STAGING_DIR
    staging.mkdir(parents=True)
    before = _contents(victim)
    (staging / "step000003-manual").symlink_to(victim)
    (staging / ".raw-step000004-manual-x").symlink_to(victim)
    _old(staging / "step000003-manual")
    _old(staging / ".raw-step000004-manual-x")
    with caplog.at_level(logging.WARNING):
        _train(logdir, schedule=None)
    assert _contents(victim) == before
    assert "left step000003-manual" in caplog.text and "Not a directory" not in caplog.text


def test_a_symlinked_staging_directory_is_not_written_through(tmp_path, victim, caplog):
    logdir = tmp_path / "run"
    logdir.mkdir()
    before = _contents(victim)
    (logdir / STAGING_DIR).symlink_to(victim)
    with caplog.at_level(logging.WARNING):
        _train(logdir)
    assert _contents(victim) == before
    assert "could not export capture" in caplog.text and "a link" in caplog.text


@pytest.mark.parametrize("which", ["steps", "findings"])
def test_symlinked_steps_and_findings_files_are_not_appended_to(tmp_path, victim, caplog, which):
    logdir = tmp_path / "run"
    (logdir / "profcallbacks").mkdir(parents=True)
    target = victim / "model.pt"
    before = target.read_bytes()
    path = (steps_file if which == "steps" else findings_file)(logdir, 0)
    path.symlink_to(target)
    prof = None

    def emit(p):
        p.session.emit(_finding())

    with caplog.at_level(logging.WARNING):
        prof = _train(logdir, steps=30, after_enter=emit, log_every_n_steps=5)
    assert prof is not None and prof.session.findings  # training and findings went on
    assert target.read_bytes() == before
    assert path.is_symlink()
    assert "a link (not followed)" in caplog.text


@pytest.mark.parametrize("which", ["steps", "findings"])
def test_hard_linked_steps_and_findings_files_are_not_appended_to(tmp_path, victim, caplog, which):
    """A hard link is the victim's own file under another name: owner and kind check out, only
    its link count gives it away."""
    logdir = tmp_path / "run"
    (logdir / "profcallbacks").mkdir(parents=True)
    target = victim / "model.pt"
    before = target.read_bytes()
    path = (steps_file if which == "steps" else findings_file)(logdir, 0)
    os.link(target, path)

    def emit(p):
        p.session.emit(_finding())

    with caplog.at_level(logging.WARNING):
        prof = _train(logdir, steps=30, after_enter=emit, log_every_n_steps=5)
    assert prof.session.findings  # training and findings went on
    assert target.read_bytes() == before
    assert os.stat(path).st_nlink == 2  # left as it was
    assert "2 hard links" in caplog.text


def test_another_users_steps_file_is_not_appended_to(tmp_path, caplog):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root (CI runs as root)")
    logdir = tmp_path / "run"
    (logdir / "profcallbacks").mkdir(parents=True)
    path = steps_file(logdir, 0)
    path.write_bytes(b"")
    os.chown(path, 65534, 65534)  # nobody's file, planted in a shared directory
    with caplog.at_level(logging.WARNING):
        _train(logdir, steps=20, log_every_n_steps=5)
    assert path.read_bytes() == b""
    assert "owned by another user" in caplog.text


def test_a_planted_capture_directory_symlink_never_receives_the_trace(tmp_path, victim):
    logdir = tmp_path / "run"
    logdir.mkdir()
    before = _contents(victim)
    (logdir / "step000002-schedule").symlink_to(victim)
    _train(logdir)
    assert _contents(victim) == before
    trace, summary = sorted((logdir / "step000002-schedule-2").iterdir())  # and its summary
    assert summary.name == summary_file_name(trace.name)
    assert stat.S_ISREG(os.lstat(trace).st_mode) and stat.S_ISREG(os.lstat(summary).st_mode)
    assert profiler_steps(load_trace(trace)) == [2, 3]


def test_sprayed_write_test_symlinks_are_never_opened(tmp_path, victim):
    logdir = tmp_path / "run"
    (logdir / "profcallbacks").mkdir(parents=True)
    target = victim / "model.pt"
    before = target.read_bytes()
    for pid in range(os.getpid(), os.getpid() + 50):  # this process's pid and those to come
        for where in (logdir, logdir / "profcallbacks"):
            (where / f".write-test-{pid}").symlink_to(target)
    _train(logdir, schedule=None)
    assert target.read_bytes() == before


def test_links_planted_in_staging_after_the_run_marker_appears(tmp_path, victim):
    """The attacker waits for run.lock, then plants links under every name the exporter used to
    use; the trace is written only inside the log directory and published as a regular file."""
    logdir = tmp_path / "run"
    target = victim / "model.pt"
    before = _contents(victim)

    def plant(prof):
        assert run_lock_file(logdir).exists()
        stage = logdir / STAGING_DIR / "step000002-schedule"
        stage.mkdir(parents=True, exist_ok=True)
        worker = f"rank0_{HOST}"
        for name in (f".{worker}.raw.json", f".{worker}.raw.json.tmp",
                     f".{worker}.2.pt.trace.json.gz.writing", f"{worker}.2.pt.trace.json.gz.ready"):
            (stage / name).symlink_to(target)

    _train(logdir, after_enter=plant)
    assert _contents(victim) == before
    published = logdir / "step000002-schedule"
    traces = [p for p in published.iterdir() if p.name.endswith(".pt.trace.json.gz")]
    assert len(traces) == 1 and stat.S_ISREG(os.lstat(traces[0]).st_mode)
    assert captured_steps(logdir) == {"step000002-schedule": [2, 3]}


def test_a_symlinked_meta_directory_refuses_the_run_at_start(tmp_path, victim):
    logdir = tmp_path / "run"
    logdir.mkdir()
    (logdir / "profcallbacks").symlink_to(victim)
    before = _contents(victim)
    with pytest.raises(PermissionError, match="a link"):
        _train(logdir)
    assert _contents(victim) == before


def test_files_are_created_with_the_users_umask(tmp_path):
    old = os.umask(0o002)
    try:
        _train(tmp_path / "run")
    finally:
        os.umask(old)
    made = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert made and all(p.stat().st_mode & 0o777 == 0o664 for p in made), [
        (p.name, oct(p.stat().st_mode)) for p in made]


def test_a_logdir_others_can_write_gets_one_warning(tmp_path, caplog):
    logdir = tmp_path / "shared"
    logdir.mkdir()
    logdir.chmod(0o1777)
    with caplog.at_level(logging.WARNING):
        _train(logdir, schedule=None)
        _train(logdir, schedule=None)
    warnings = [r for r in caplog.records if "writable by every user" in r.getMessage()]
    assert len(warnings) == 1


def test_remove_own_tree_leaves_links_and_foreign_names(tmp_path, victim):
    root = tmp_path / "root"
    tree = root / "stage"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.pt.trace.json.gz").write_bytes(b"x")
    (tree / "link").symlink_to(victim)
    assert not safefs.remove_own_tree(tree, inside=root)  # the link stays, so does the directory
    assert (tree / "link").is_symlink() and not (tree / "sub").exists()
    assert _contents(victim) != {} and safefs.remove_own(tree / "link", inside=root) is False


def _finding():
    from profcallbacks.findings import Finding

    return Finding(kind="dataloader_stall", severity="warning", step=1, rank=0, message="x")
