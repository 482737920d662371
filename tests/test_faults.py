"""Bad input is rejected before step 1; profiling faults never stop training or leave half files."""

import errno
import gzip
import logging
import os

import pytest
import torch

from helpers import capture_dirs, captured_steps, load_trace, tiny_model, train_step
from profcallbacks import ProfilerConfig, Schedule, StepProfiler, TraceOptions
from profcallbacks.capture import exporter as export_helper


def test_file_path_logdir_fails_at_enter(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    prof = StepProfiler(path, schedule=None)
    with pytest.raises(NotADirectoryError, match="not-a-dir.*is a file"):
        prof.__enter__()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_logdir_fails_at_enter(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="not writable"), StepProfiler(tmp_path / "x"):
            pass
    finally:
        tmp_path.chmod(0o700)


def test_unwritable_logdir_fails_at_enter_even_as_root(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="not writable"), StepProfiler(blocker / "sub"):
        pass


@pytest.mark.parametrize("kwargs, match", [
    ({"max_captures": 0}, r"max_captures=0\): max_captures must be an int between 1 and"),
    ({"log_every_n_steps": -5}, r"log_every_n_steps=-5\): log_every_n_steps must be an int between 1"),
    ({"capture_file_poll_s": 0}, r"capture_file_poll_s=0\)"),
    ({"ranks": (-1,)}, r"ranks=\(-1,\)"),
    ({"schedule": "10,1,3"}, "schedule='10,1,3'\\): schedule must be a profcallbacks.Schedule"),
])
def test_bad_options_rejected_at_construction(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepProfiler(tmp_path, **kwargs)


def test_bad_activity_named():
    with pytest.raises(ValueError, match=r"activities=\('tpu',\)"):
        TraceOptions(activities=("tpu",))


def test_capture_steps_validated():
    with pytest.raises(ValueError, match="capture_steps"):
        ProfilerConfig(capture_steps=0)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_inside_active_window(tmp_path, error):
    model, opt = tiny_model()
    with pytest.raises(type(error)), StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=1,
                                                                               active=5)) as prof:
        for i in range(10):
            train_step(model, opt)
            prof.step()
            if i == 4:
                raise error
    assert not torch.autograd.profiler._is_profiler_enabled
    assert captured_steps(tmp_path) == {"step000002-schedule-partial": [2, 3, 4]}
    for path in tmp_path.rglob("*.gz"):  # every file is a complete gzip stream
        with gzip.open(path, "rb") as f:
            f.read()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".writing", ".ready", ".raw.json"))]
    fresh = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with fresh:
        train_step(model, opt)
    assert len(fresh.events()) > 0


def test_disk_full_during_export_warns_once_and_training_continues(tmp_path, monkeypatch, caplog):
    real_open = gzip.GzipFile
    calls = {"n": 0}

    def full_disk_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(gzip, "GzipFile", full_disk_once)
    monkeypatch.setattr(export_helper, "USE_HELPER_PROCESS", False)  # the fault in this process
    model, opt = tiny_model()
    schedule = Schedule(skip_first=1, wait=1, warmup=0, active=2, repeat=2)
    with caplog.at_level(logging.WARNING), StepProfiler(tmp_path, schedule=schedule) as prof:
        for _ in range(10):
            train_step(model, opt)
            prof.step()
    warnings = [r for r in caplog.records if "could not export" in r.getMessage()]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()
    assert captured_steps(tmp_path) == {"step000005-schedule": [5, 6]}  # later window still tried
    assert [d.name for d in capture_dirs(tmp_path)] == ["step000005-schedule"]
    assert not list((tmp_path / ".profcallbacks-staging").rglob("*.*"))


def test_second_profiler_already_running_does_not_crash_training(tmp_path, caplog):
    model, opt = tiny_model()
    outer = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with outer, caplog.at_level(logging.WARNING):
        with StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=0, active=2)) as prof:
            for _ in range(5):
                train_step(model, opt)
                prof.step()
    refusals = [r for r in caplog.records if "could not start the profiler" in r.getMessage()]
    assert len(refusals) == 1  # once for the window, not once per step of it


def test_step_outside_the_with_block_warns_once_and_does_nothing(tmp_path, caplog):
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=0, warmup=0, active=2))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            prof.step()
    assert [r.getMessage() for r in caplog.records if "not running" in r.getMessage()] == [
        "profcallbacks: step() called while the profiler is not running (use `with prof:` or "
        "call it between open and close); ignored."]
    assert prof.session.step == 0 and not torch.autograd.profiler._is_profiler_enabled


def test_a_raw_trace_orjson_refuses_is_still_written(tmp_path):
    """NaN in the raw trace (orjson will not read it) and an integer beyond 64 bits (orjson will
    not write it): the standard library takes over and the capture is published."""
    import json

    from profcallbacks.capture.trace_writer import CaptureWriter, new_raw_trace_path
    from profcallbacks.core.capture_info import CaptureInfo, StepSpan
    from profcallbacks.core.ranks import RankInfo

    info = CaptureInfo("step000003-manual", "manual", 3, (StepSpan(3, 10_000, 20_000),), False,
                       os.getpid(), 1, RankInfo())
    raw = new_raw_trace_path(tmp_path, info)
    raw.write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": NaN, '
                   '"args": {"id": 1180591620717411303424}}], "baseTimeNanoseconds": 0}')
    writer = CaptureWriter(tmp_path)
    writer.export(raw, info)
    assert writer.failures == 0 and [p.name for p in writer.exported] == [info.name]
    (trace_file,) = (tmp_path / info.name).glob("*.pt.trace.json.gz")
    trace = json.loads(gzip.decompress(trace_file.read_bytes()))
    assert trace["traceEvents"][0]["args"]["id"] == 2 ** 70
    assert trace["profcallbacks"]["steps"] == [3]


def test_a_rank_still_writing_when_another_publishes_the_capture_lands_in_it(tmp_path,
                                                                              monkeypatch):
    """Two ranks of one capture: rank 1 is writing its file into the stage when rank 0, done
    waiting, publishes the stage (it moves, rank 1's file with it). Rank 1's file still ends up
    in the capture under its final name, not as a half-named ``.ready`` left there."""
    from profcallbacks.capture import trace_writer
    from profcallbacks.core.capture_info import CaptureInfo, StepSpan
    from profcallbacks.core.ranks import RankInfo

    writers = [trace_writer.CaptureWriter(tmp_path, tracing_ranks=2, publish_timeout_s=0)
               for _ in range(2)]
    infos = [CaptureInfo("step000003-manual", "manual", 3, (StepSpan(3, 10_000, 20_000),), False,
                         os.getpid(), 1, RankInfo(rank=r, world_size=2)) for r in range(2)]
    raws = []
    for info in infos:
        raw = trace_writer.new_raw_trace_path(tmp_path, info)
        raw.write_text('{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}')
        raws.append(raw)
    writers[0].export(raws[0], infos[0])  # staged, waiting for rank 1
    assert writers[0].exported == []
    create = trace_writer.create_exclusive

    def create_then_rank0_gives_up(*args, **kwargs):
        fd = create(*args, **kwargs)
        monkeypatch.setattr(trace_writer, "create_exclusive", create)
        writers[0].close()  # publishes the stage with rank 1's file half written in it
        return fd

    monkeypatch.setattr(trace_writer, "create_exclusive", create_then_rank0_gives_up)
    writers[1].export(raws[1], infos[1])
    writers[1].close()
    final = tmp_path / "step000003-manual"
    assert sorted(p.name.split("_")[0] for p in final.glob("*.pt.trace.json.gz")) == \
        ["rank0", "rank1"], sorted(p.name for p in final.iterdir())
    assert not [p for p in final.iterdir() if p.name.endswith((".ready", ".writing"))]
    assert [p.name for p in writers[1].exported] == ["step000003-manual"]
    for path in final.glob("*.pt.trace.json.gz"):
        load_trace(path)
