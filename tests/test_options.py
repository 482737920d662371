"""Every option of every config is checked at construction: one exception type, one message style."""

import math

import pytest

from profcallbacks import (
    MemoryConfig,
    ProfilerConfig,
    RankInfo,
    Schedule,
    SlowdownConfig,
    StallConfig,
    StepProfiler,
    StragglerConfig,
    SyncAuditConfig,
    TraceOptions,
)
from profcallbacks.capture.planner import MAX_CAPTURE_STEPS
from profcallbacks.detect.base import Participant

NAN, INF = math.nan, math.inf

BAD = [
    # (config, keyword arguments, the option the message must name)
    (TraceOptions, {"record_shapes": "yes"}, "record_shapes"),
    (TraceOptions, {"with_stack": 1}, "with_stack"),
    (TraceOptions, {"activities": ("cpu", "cpu")}, "activities"),
    (TraceOptions, {"activities": 1}, "activities"),
    (TraceOptions, {"activities": ()}, "activities"),
    (StallConfig, {"share_threshold": NAN}, "share_threshold"),
    (StallConfig, {"clear_share": NAN}, "clear_share"),
    (StallConfig, {"isolated_factor": INF}, "isolated_factor"),
    (StallConfig, {"isolated_min_s": NAN}, "isolated_min_s"),
    (StallConfig, {"window": 10**12}, "window"),
    (StallConfig, {"block_steps": 2.0}, "block_steps"),
    (SlowdownConfig, {"min_steps": 2 * 10**9}, "min_steps"),
    (SlowdownConfig, {"min_duration_s": NAN}, "min_duration_s"),
    (SyncAuditConfig, {"repeat_at": 99}, "repeat_at"),
    (SlowdownConfig, {"threshold": NAN}, "threshold"),
    (SlowdownConfig, {"threshold": "1.2"}, "threshold"),
    (SlowdownConfig, {"baseline_steps": 10**12}, "baseline_steps"),
    (SlowdownConfig, {"straggler": True}, "straggler"),
    (StragglerConfig, {"every_n_steps": 1.5}, "every_n_steps"),
    (StragglerConfig, {"threshold": INF}, "threshold"),
    (SyncAuditConfig, {"warn_blocking_ms": NAN}, "warn_blocking_ms"),
    (SyncAuditConfig, {"allow": "train.py:42"}, "allow"),
    (SyncAuditConfig, {"steps": 10**6}, "steps"),
    (Schedule, {"active": 2.5}, "active"),
    (Schedule, {"skip_first": True}, "skip_first"),
    (ProfilerConfig, {"capture_file_poll_s": NAN}, "capture_file_poll_s"),
    (ProfilerConfig, {"capture_file_poll_s": INF}, "capture_file_poll_s"),
    (ProfilerConfig, {"watch_capture_file": "false"}, "watch_capture_file"),
    (ProfilerConfig, {"tensorboard_scalars": None}, "tensorboard_scalars"),
    (ProfilerConfig, {"stall": True}, "stall"),
    (ProfilerConfig, {"slowdown": {"threshold": 1.3}}, "slowdown"),
    (ProfilerConfig, {"sync_audit": "yes"}, "sync_audit"),
    (ProfilerConfig, {"trace": {"with_stack": True}}, "trace"),
    (ProfilerConfig, {"ranks": 0}, "ranks"),
    (ProfilerConfig, {"ranks": ()}, "ranks"),
    (ProfilerConfig, {"capture_steps": MAX_CAPTURE_STEPS + 1}, "capture_steps"),
    (ProfilerConfig, {"max_captures": 2.0}, "max_captures"),
    (ProfilerConfig, {"memory": True}, "memory"),
    (MemoryConfig, {"sample_every_s": NAN}, "sample_every_s"),
    (MemoryConfig, {"window_steps": 4}, "window_steps"),
    (MemoryConfig, {"min_rate_mb_per_1k_steps": 0}, "min_rate_mb_per_1k_steps"),
    (MemoryConfig, {"capture_sites": "yes"}, "capture_sites"),
    (MemoryConfig, {"hold_steps": 10**12}, "hold_steps"),
    (RankInfo, {"rank": 0, "local_rank": 1, "world_size": 0, "host": 1}, "world_size"),
    (RankInfo, {"rank": 3, "world_size": 2}, "rank"),
    (RankInfo, {"host": ""}, "host"),
]


@pytest.mark.parametrize("config, kwargs, option", BAD,
                         ids=[f"{c.__name__}-{o}-{k[o]!r}" for c, k, o in BAD])
def test_bad_value_is_a_value_error_naming_option_value_and_fix(config, kwargs, option):
    with pytest.raises(ValueError) as info:
        config(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{config.__name__}({option}={kwargs[option]!r}): {option} must be "), message
    assert ". Use " in message, message  # the fix, after what was wrong


def test_threshold_alone_works_with_the_default_spike_cap():
    config = SlowdownConfig(threshold=1.5)
    assert config.spike_ratio > config.threshold


@pytest.mark.parametrize("logdir", ["", "   "])
def test_empty_logdir_is_refused_instead_of_writing_into_the_working_directory(logdir):
    with pytest.raises(ValueError, match="logdir"):
        StepProfiler(logdir)


@pytest.mark.parametrize("logdir", [None, 42])
def test_a_logdir_that_is_no_path_is_refused_with_the_fix(logdir):
    with pytest.raises(ValueError, match=rf"StepProfiler\(logdir={logdir}\): logdir must be a directory "
                                         r"path .* Use e.g. logdir='runs/exp1'"):
        StepProfiler(logdir)


def test_on_finding_must_be_callable(tmp_path):
    with pytest.raises(ValueError, match=r"on_finding=42\): on_finding must be a callable"):
        StepProfiler(tmp_path, on_finding=42)


def _mounted_read_only_root_with_writable_meta(root):
    """A log directory whose root is read-only while its profcallbacks/ subdirectory is writable
    (what the old start-up probe, which tried only the subdirectory, let through)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only tmpfs")
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    (root / "profcallbacks").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root / "profcallbacks")],
                   check=True)
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)


def test_start_up_probe_checks_where_captures_and_tensorboard_write(tmp_path):
    import subprocess

    root = tmp_path / "logs"
    _mounted_read_only_root_with_writable_meta(root)
    try:
        with pytest.raises(PermissionError, match=r"logdir=.* is not writable"):
            with StepProfiler(root, tensorboard_scalars=False):
                pass
    finally:
        subprocess.run(["umount", str(root / "profcallbacks")], check=False)
        subprocess.run(["umount", str(root)], check=False)


class _RaisingScalars(Participant):
    calls = 0

    def observe(self, record):
        return ()

    def scalars(self):
        _RaisingScalars.calls += 1
        raise RuntimeError("broken scalars")


class _RaisingLoaderHook(Participant):
    def observe(self, record):
        return ()

    def set_loader(self, info):
        raise RuntimeError("broken set_loader")


def test_raising_detector_hooks_warn_once_and_never_reach_the_loop(tmp_path, caplog):
    import logging

    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, log_every_n_steps=2,
                        sync_audit=False)
    prof.session.add_detector(_RaisingScalars())
    prof.session.add_detector(_RaisingLoaderHook())
    with caplog.at_level(logging.WARNING), prof:
        for _ in prof.wrap(range(10)):  # set_loader raises inside wrap(): the loop goes on
            prof.step()
    assert _RaisingScalars.calls == 1  # disabled after its first failure, not warned per summary
    warnings = [r.getMessage() for r in caplog.records if "disabled for the rest" in r.getMessage()]
    assert len(warnings) == 2, warnings
