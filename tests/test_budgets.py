"""Byte budgets on real CPU runs: captures trimmed to fit, the log directory kept within bounds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import helpers
from helpers import capture_dirs, load_trace, trace_files
from profcallbacks import ByteBudget, Schedule, StepProfiler, TraceOptions
from profcallbacks.capture.retention import logdir_capture_bytes
from profcallbacks.capture.trimming import CaptureSizer
from profcallbacks.layout import retention_log_file
from profcallbacks.report import build_report, locate_run
from profcallbacks.report.render.html import render_html
from profcallbacks.report.render.text import render_text

pytestmark = pytest.mark.usefixtures("one_thread")

QUIET = {key: value for key, value in helpers.QUIET.items() if key != "schedule"} | {"memory": None}
"""The schedule is each test's own."""


def many_modules(n: int = 12) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(n)])
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(prof: StepProfiler, steps: int, on_step=None) -> None:
    model, opt = many_modules()
    with prof:
        for step in range(steps):
            loss = model(torch.randn(4, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if on_step is not None:
                on_step(step, prof)
            prof.step()


def has_python_frames(trace: dict) -> bool:
    return any(e.get("cat") == "python_function" for e in trace["traceEvents"])


def test_with_stack_and_shapes_stay_under_a_small_budget_with_trims_recorded(tmp_path):
    budget = 30_000
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, wait=1, active=4,
                                                     repeat=2),
                        trace=TraceOptions(with_stack=True, record_shapes=True),
                        budget=ByteBudget(capture_bytes=budget, logdir_bytes=None), **QUIET)
    train(prof, 16)
    dirs = capture_dirs(tmp_path)
    assert len(dirs) == 2
    for d in dirs:
        [file] = trace_files(d)
        assert file.stat().st_size <= budget, (d.name, file.stat().st_size)
        trace = load_trace(file)
        block = trace["profcallbacks"]["budget"]
        assert block["capture_bytes"] == budget and block["requested_active_steps"] == 4
        assert "with_stack off" in block["trimmed"] and block["reason"]
        assert not has_python_frames(trace)  # the trim was applied, not only written down
        assert len(trace["profcallbacks"]["steps"]) == block["active_steps"] >= 1
    assert load_trace(trace_files(dirs[0])[0])["profcallbacks"]["budget"]["first_step_bytes"]
    report = build_report(locate_run(tmp_path))
    assert all("with_stack off" in c["budget"]["trimmed"] for c in report["captures"])
    assert "trimmed to 30 kB: " in render_text(report)
    page = render_html(report)
    section = page[page.index("<h2 id=budgets>Trace budgets</h2>"):]
    assert section.count("trimmed to 30 kB: ") == 2 and "with_stack off" in section


def test_without_a_budget_the_same_capture_keeps_its_stacks(tmp_path):
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=4, repeat=1),
                        trace=TraceOptions(with_stack=True, record_shapes=True), budget=None,
                        **QUIET)
    train(prof, 8)
    [file] = trace_files(capture_dirs(tmp_path)[0])
    trace = load_trace(file)
    assert has_python_frames(trace) and "budget" not in trace["profcallbacks"]
    assert file.stat().st_size > 4 * 30_000  # the budget above had something to trim


def test_sizer_trims_in_the_documented_order():
    sizer = CaptureSizer(100_000)
    full = TraceOptions(with_stack=True, record_shapes=True, profile_memory=True)
    sizer.record_raw(full, steps=1, raw_bytes=200_000)
    sizer.record_disk(raw_bytes=200_000, disk_bytes=20_000)  # 20 kB a step on disk
    assert sizer.plan(full, 8, trigger="schedule").trimmed == ("active steps 8 -> 4",)
    fewer = sizer.plan(full, 3, trigger="schedule", most=2)  # a window whose first step went
    assert (fewer.active, fewer.requested_active, fewer.trimmed) == (2, 3, ("active steps 3 -> 2",))
    sizer.record_raw(full, steps=1, raw_bytes=1_300_000)  # 130 kB a step: one step is too much
    trim = sizer.plan(full, 8, trigger="schedule")
    assert trim.trimmed == ("active steps 8 -> 1", "with_stack off") and not trim.options.with_stack
    assert trim.options.record_shapes and trim.predicted_bytes <= 100_000
    sizer.record_raw(full, steps=1, raw_bytes=3_000_000)  # 300 kB: nothing makes it fit
    trim = sizer.plan(full, 8, trigger="schedule")
    assert trim.trimmed[1:] == ("with_stack off", "record_shapes off", "profile_memory off")
    assert trim.active == 1 and "still over" in trim.reason
    memory = sizer.plan(full, 2, trigger="memory")
    assert memory.options.profile_memory  # a memory capture keeps its allocations


def test_a_capture_over_its_budget_is_kept_marked_and_the_next_is_trimmed(tmp_path):
    extra, _ = many_modules(72)

    def grow(step, prof):  # after the first capture, steps record ~6x the events it saw
        if step >= 7:
            extra(torch.randn(4, 16)).sum().backward()

    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, wait=1, active=3,
                                                     repeat=3),
                        budget=ByteBudget(capture_bytes=150_000, logdir_bytes=None), **QUIET)
    train(prof, 18, grow)
    report = build_report(locate_run(tmp_path))
    over = [c["directory"] for c in report["captures"] if c["budget"]["over_budget"]]
    sizes = [(c["directory"], c["files"][0]["bytes"], c["budget"]["trimmed"])
             for c in report["captures"]]
    assert over == ["step000009-schedule"], sizes
    later = [c for c in report["captures"] if c["directory"] > over[0]]
    assert later and later[0]["files"][0]["bytes"] <= 150_000, sizes
    assert later[0]["budget"]["trimmed"], sizes
    assert "kept whole" in render_text(report)
    assert "step000009-schedule: over its budget of 150 kB, kept whole" in render_html(report)


def test_repeat_forever_keeps_the_log_directory_in_budget_oldest_healthy_first(tmp_path):
    foreign = tmp_path / "step000000-manual"  # an earlier run's capture: never ours to remove
    foreign.mkdir()
    (foreign / "old.pt.trace.json.gz").write_bytes(os.urandom(4000))
    budget = 120_000

    def slowdown_at_9(step, prof):
        if step == 9:
            prof.session.request_capture(steps=2, trigger="slowdown")

    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=0, wait=1, active=1,
                                                     repeat=0),
                        max_captures=30, budget=ByteBudget(capture_bytes=None,
                                                           logdir_bytes=budget), **QUIET)
    train(prof, 40, slowdown_at_9)
    names = [d.name for d in capture_dirs(tmp_path)]
    assert logdir_capture_bytes(tmp_path) <= budget
    assert "step000000-manual" in names and (foreign / "old.pt.trace.json.gz").exists()
    slowdown = [n for n in names if n.endswith("-slowdown")]
    assert slowdown == ["step000010-slowdown"]
    removed = [json.loads(line) for line in retention_log_file(tmp_path).read_text().splitlines()]
    assert removed and all(r["trigger"] == "schedule" for r in removed)
    removed_steps = [int(r["capture"][4:10]) for r in removed]
    kept_schedule = [int(n[4:10]) for n in names if n.endswith("-schedule")]
    assert removed_steps == sorted(removed_steps)  # oldest first
    assert max(removed_steps) < min(kept_schedule)  # what is left is the newest
    report = build_report(locate_run(tmp_path))
    assert [r["capture"] for r in report["removed_captures"]] == [r["capture"] for r in removed]
    assert f"removed {removed[0]['capture']}" in render_text(report)


def test_retention_never_removes_a_file_it_did_not_write(tmp_path):
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=1, warmup=0, wait=1, active=1,
                                                     repeat=0),
                        max_captures=12, budget=ByteBudget(capture_bytes=None,
                                                           logdir_bytes=60_000), **QUIET)
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me")

    planted = []

    def plant(step, prof):  # the first capture's file is swapped for a link to another file
        first = tmp_path / "step000002-schedule"
        if step != 3:
            return
        deadline = time.monotonic() + 30
        while not (first.is_dir() and trace_files(first)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the helper process publishes it meanwhile
        if trace_files(first):
            [file] = trace_files(first)
            file.unlink()
            file.symlink_to(victim)
            (first / "notes.txt").write_text("the user's")
            planted.append(step)

    train(prof, 30, plant)
    assert planted
    assert victim.read_text() == "keep me"
    first = tmp_path / "step000002-schedule"
    assert (first / "notes.txt").exists() and any(p.is_symlink() for p in first.iterdir())
    assert logdir_capture_bytes(tmp_path) <= 60_000


def test_budget_options_are_validated():
    with pytest.raises(ValueError, match="capture_bytes"):
        ByteBudget(capture_bytes=10)
    with pytest.raises(ValueError, match="logdir_bytes"):
        ByteBudget(capture_bytes=50_000_000, logdir_bytes=20_000_000)
    with pytest.raises(ValueError, match="budget"):
        StepProfiler(Path("x"), budget=100_000_000)


def profiled_steps(prof: StepProfiler, steps: int) -> list[int]:
    """Train ``steps`` steps; the steps during which torch.profiler was on."""
    profiled: list[int] = []
    train(prof, steps, lambda step, _: profiled.extend(
        [step] if torch.autograd.profiler._is_profiler_enabled else []))
    return profiled


def test_the_first_capture_measures_its_first_step_and_keeps_it_in_one_trace(tmp_path):
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=4),
                        trace=TraceOptions(with_stack=True), budget=ByteBudget(), **QUIET)
    assert profiled_steps(prof, 8) == [3, 4, 5, 6]  # no step profiled besides the window
    assert not (tmp_path / ".profcallbacks-staging").exists()  # the first step's file is gone
    [directory] = capture_dirs(tmp_path)
    [file] = trace_files(directory)
    trace = load_trace(file)
    block = trace["profcallbacks"]["budget"]
    assert trace["profcallbacks"]["steps"] == [3, 4, 5, 6] and block["active_steps"] == 4
    assert block["first_step_bytes"] > 0 and block["trimmed"] == []
    events = trace["traceEvents"]
    for step in trace["profcallbacks"]["steps"]:  # each step holds its own operators
        [span] = [e for e in events if e.get("name") == f"ProfilerStep#{step}"]
        inside = [e for e in events if e.get("name") == "aten::addmm"
                  and span["ts"] <= e["ts"] <= span["ts"] + span["dur"]]
        assert len(inside) == 12, (step, len(inside))
    frames = [e["args"] for e in events if e.get("cat") == "python_function"]
    ids = [f["Python id"] for f in frames]
    assert len(ids) == len(set(ids)) and has_python_frames(trace)
    assert {f["Python parent id"] for f in frames} - {None} <= set(ids)
    flows = [(e["ph"], e["id"]) for e in events if e.get("cat") == "fwdbwd"]
    assert len(flows) == len(set(flows)) > 0  # each flow id starts and ends once
    processes = [e["pid"] for e in events if e.get("name") == "process_name"]
    assert len(processes) == len(set(processes))  # each piece's bookkeeping appears once
    assert sum(e.get("name") == "Record Window End" for e in events) == 1
    [session] = [e for e in events if e.get("cat") == "Trace"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert session["ts"] <= min(e["ts"] for e in steps)
    assert max(e["ts"] + e["dur"] for e in steps) <= session["ts"] + session["dur"]


def first_capture_over_its_budget(tmp_path: Path, active: int) -> tuple[list[int], Path]:
    """A with_stack run whose first step does not fit 30 kB: the steps profiled, the capture."""
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=active),
                        trace=TraceOptions(with_stack=True),
                        budget=ByteBudget(capture_bytes=30_000, logdir_bytes=None), **QUIET)
    enabled = profiled_steps(prof, 8)
    assert not (tmp_path / ".profcallbacks-staging").exists()
    [directory] = capture_dirs(tmp_path)
    return enabled, directory


@pytest.mark.parametrize("active", [1, 3])
def test_a_first_step_over_the_budget_is_dropped_and_the_window_records_trimmed(tmp_path,
                                                                                active):
    enabled, directory = first_capture_over_its_budget(tmp_path, active)
    [file] = trace_files(directory)
    trace = load_trace(file)
    block = trace["profcallbacks"]["budget"]
    steps = trace["profcallbacks"]["steps"]
    assert "with_stack off" in block["trimmed"] and "was dropped" in block["reason"]
    assert not has_python_frames(trace) and file.stat().st_size <= 30_000
    assert len(steps) == block["active_steps"] and block["requested_active_steps"] == active
    assert enabled == [3, *steps]  # measured at step 3, then recorded trimmed
    if active == 1:  # its one step is recorded again, one step later
        assert directory.name == "step000004-schedule" and steps == [4]
    else:  # the rest of the window, under its own name (as on every rank)
        assert directory.name == "step000003-schedule" and steps[0] == 4
        assert f"active steps {active} -> {len(steps)}" in block["trimmed"]
