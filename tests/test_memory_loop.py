"""Memory work on real loops through StepProfiler: creep, sites, out_of_memory, the report, captures."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import QUIET
from memory_scenario import keep_location, leaky_step, release
from profcallbacks import MemoryConfig, StepProfiler
from profcallbacks.core.triggers import MEMORY
from profcallbacks.detect.memory import read_rss_mb
from profcallbacks.findings import MEMORY_CREEP, MEMORY_SITES, OUT_OF_MEMORY
from profcallbacks.layout import findings_file, steps_file
from profcallbacks.report import build_report, locate_run
from profcallbacks.report.render.html import render_html
from profcallbacks.report.render.text import render_text


def test_leaky_loop_is_flagged_with_its_rate_and_the_keeping_line(tmp_path):
    """The issue's done-when: 256 KB kept per step, real RSS, real capture, exact line."""
    assert read_rss_mb() is not None
    model = torch.nn.Linear(16, 16)
    release()
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), log_every_n_steps=50,
                        **QUIET)  # a sample every 50 steps, however short they are
    with prof:
        for _ in range(2000):
            leaky_step(model, torch.randn(4, 16), 64 * 1024).backward()
            prof.step()
    release()
    creep = [f for f in prof.findings if f.kind == MEMORY_CREEP]
    sites = [f for f in prof.findings if f.kind == MEMORY_SITES]
    assert len(creep) == 1 and creep[0].step < 2000
    assert creep[0].details["growth_mb_per_1k_steps"] == pytest.approx(256, rel=0.3)
    assert sites and sites[0].details["sites"][0]["location"] == keep_location()
    assert sites[0].details["sites"][0]["count"] == 3  # capture_steps=3, each kept 256 KB
    assert [p.name for p in prof.captures] == [sites[0].details["capture"]]
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    assert all(row["process_rss_mb"] > 0 for row in rows)
    assert rows[-1]["process_rss_mb"] - rows[0]["process_rss_mb"] > 300

    report = build_report(locate_run(tmp_path))
    memory = report["memory"]
    assert memory["source"] == "process_rss" and len(memory["samples"]) == len(rows) == 40
    assert memory["per_rank"][0]["last_mb"] - memory["per_rank"][0]["first_mb"] > 300
    assert [c["step"] for c in memory["creep"]] == [creep[0].step]
    assert memory["sites"][0]["location"] == keep_location()
    text = render_text(report)
    assert f"    {keep_location()}  0.75 MB in 3 tensors (rank 0)" in text
    assert "id=memory-plot" in render_html(report) and keep_location() in render_html(report)


def test_flat_loop_raises_nothing(tmp_path):
    model = torch.nn.Linear(16, 16)
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with prof:
        for _ in range(1500):
            model(torch.randn(4, 16)).sum().backward()
            prof.step()
    assert [f for f in prof.findings if f.kind.startswith("memory")] == []
    assert prof.captures == []


def test_out_of_memory_is_in_the_findings_file_before_the_error_propagates(tmp_path):
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with pytest.raises(MemoryError):
        with prof:
            for step in range(60):
                if step == 55:
                    assert not findings_file(tmp_path, 0).exists()
                    raise MemoryError("cannot allocate 80 GB")
                prof.step()
    written = [json.loads(line) for line in findings_file(tmp_path, 0).read_text().splitlines()]
    assert [f["kind"] for f in written] == [OUT_OF_MEMORY]
    assert written[0]["step"] == 55 and written[0]["severity"] == "error"
    assert written[0]["details"]["memory"]["process_rss_mb"] > 0
    assert "cannot allocate 80 GB" in written[0]["details"]["error"]


def test_other_errors_give_no_out_of_memory(tmp_path):
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with pytest.raises(RuntimeError):
        with prof:
            prof.step()
            raise RuntimeError("boom")
    assert prof.findings == []


def test_report_of_a_run_without_memory_numbers_has_no_memory_section(tmp_path):
    prof = StepProfiler(tmp_path, memory=None, log_every_n_steps=5, **QUIET)
    with prof:
        for _ in range(10):
            prof.step()
    report = build_report(locate_run(tmp_path))
    assert report["memory"] is None and "Memory (" not in render_text(report)


def steps_rows(logdir, memory):
    with StepProfiler(logdir, memory=memory, log_every_n_steps=5, **QUIET) as prof:
        for _ in range(10):
            prof.step()
    return [json.loads(line) for line in steps_file(logdir, 0).read_text().splitlines()]


def test_memory_off_writes_no_memory_fields(tmp_path):
    """The same run with memory numbers on writes them in every row: off, no row has any."""
    with_memory = steps_rows(tmp_path / "on", MemoryConfig(sample_every_s=0))
    rows = steps_rows(tmp_path / "off", None)
    assert with_memory and all(row.get("process_rss_mb", 0) > 0 for row in with_memory)
    memory_fields = {key for row in with_memory for key in row} - {key for row in rows for key in row}
    assert "process_rss_mb" in memory_fields
    assert rows and not any("process_rss_mb" in row for row in rows)


def test_memory_capture_asked_for_explicitly_then_sync_audit_right_after(tmp_path, caplog):
    """The audit's spy starts at the step the memory spy stops: both leave cleanly, both report."""
    from profcallbacks import SyncAuditConfig

    model = torch.nn.Linear(16, 16)
    kept = []
    options = dict(QUIET, sync_audit=SyncAuditConfig(at_step=12, steps=1))
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **options)
    with prof:
        for step in range(30):
            if step == 10:
                prof.session.request_capture(trigger=MEMORY, profile_memory=True)
            loss = model(torch.randn(4, 16)).sum()
            kept.append(torch.ones(1000))  # KEPT-TOO
            loss.item()
            prof.step()
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("KEPT-TOO"))
    kinds = [f.kind for f in prof.findings]
    assert "sync_point" in kinds
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    sites = [f for f in prof.findings if f.kind == MEMORY_SITES][0].details["sites"]
    assert sites[0]["location"].endswith(f"test_memory_loop.py:{line}") and sites[0]["count"] == 3
    assert torch.ones(2).sum().item() == 2.0  # no dispatch mode left behind


def test_memory_scalars_are_in_tensorboard(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    options = dict(QUIET, tensorboard_scalars=True)
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), log_every_n_steps=10,
                        **options)
    with prof:
        for _ in range(30):
            prof.step()
    events = event_accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    rss = events.Scalars("profcallbacks/process_rss_mb")
    assert [e.step for e in rss] == [9, 19, 29] and all(e.value > 0 for e in rss)


def test_memory_capture_counts_towards_max_captures(tmp_path):
    from profcallbacks import Schedule

    options = dict(QUIET, schedule=Schedule(skip_first=2, warmup=0, active=1), max_captures=1)
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **options)
    with prof:
        for step in range(30):
            if step == 10:
                prof.session.request_capture(trigger=MEMORY, profile_memory=True)
            prof.step()
    assert [p.name for p in prof.captures] == ["step000002-schedule"]
    assert [f.kind for f in prof.findings if f.kind != "capture_verdict"] == []
