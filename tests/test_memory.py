"""Memory numbers, memory_creep alerts, the lines that keep memory, and out_of_memory findings."""

from __future__ import annotations

import json
import random

import pytest
import torch

from memory_scenario import keep_location, leaky_step, release
from profcallbacks import MemoryConfig, ProfilerConfig, StepProfiler
from profcallbacks.core.triggers import MEMORY, CaptureRequest
from profcallbacks.detect.memory import MemoryCreepDetector, read_rss_mb
from profcallbacks.detect.memory_sites import MemorySiteSpy
from profcallbacks.findings import MEMORY_CREEP, MEMORY_SITES, OUT_OF_MEMORY
from profcallbacks.layout import findings_file, steps_file
from profcallbacks.report import build_report, locate_run
from profcallbacks.report.html import render_html
from profcallbacks.report.text import render_text

QUIET = dict(schedule=None, stall=None, slowdown=None, sync_audit=False,
             tensorboard_scalars=False, watch_capture_file=False)


def run_detector(series, *, steps: int, every: int = 50, config: MemoryConfig | None = None):
    """Feed ``series(step)`` MB to a detector at every ``every``-th step, with 2 MB of noise."""
    noise = random.Random(0)
    detector = MemoryCreepDetector(config or MemoryConfig(), rank=0)
    return [f for step in range(every - 1, steps, every)
            for f in detector.observe(step, series(step) + noise.uniform(-2, 2))]


def test_growth_of_256_kb_per_step_is_flagged_with_its_rate():
    findings = run_detector(lambda step: 500 + 0.25 * step, steps=2000)
    assert [f.kind for f in findings] == [MEMORY_CREEP]
    assert findings[0].step < 2000
    assert findings[0].details["growth_mb_per_1k_steps"] == pytest.approx(250, rel=0.3)
    assert findings[0].details["source"] == "process_rss"
    assert findings[0].capture == CaptureRequest(MEMORY, profile_memory=True)


@pytest.mark.parametrize("warmup_steps", [200, 0])
def test_warm_up_growth_then_flat_raises_nothing(warmup_steps):
    findings = run_detector(lambda step: 300 + 2 * min(step, 100), steps=5000, every=10,
                            config=MemoryConfig(warmup_steps=warmup_steps))
    assert findings == []


@pytest.mark.parametrize("jump_at", [300, 700, 1200, 2500])
def test_one_jump_then_flat_raises_nothing(jump_at):
    findings = run_detector(lambda step: 400 + (300 if step >= jump_at else 0), steps=5000)
    assert findings == []


def test_cache_growing_in_two_steps_raises_nothing():
    findings = run_detector(lambda step: 400 + 128 * (step >= 900) + 128 * (step >= 1400),
                            steps=5000)
    assert findings == []


def test_one_finding_per_episode_and_again_after_a_flat_spell():
    def series(step):
        return 500 + 0.25 * min(step, 3000) + 0.25 * max(step - 6000, 0)

    findings = run_detector(series, steps=9000)
    assert len(findings) == 2
    assert findings[0].step < 2000 and 6000 < findings[1].step < 8000


def test_cuda_total_gives_the_step_the_device_is_full():
    detector = MemoryCreepDetector(MemoryConfig(warmup_steps=0, window_steps=100), rank=0,
                                   source="cuda_allocated", total_mb=1100.0)
    findings = [f for s in range(0, 100, 10) for f in detector.observe(s, 100.0 + s)]
    assert findings[0].details["full_at_step"] == 70 + 930
    assert "device is full at step 1,000" in findings[0].message


def test_spy_names_the_user_line_of_kept_memory_also_through_libraries():
    linear = torch.nn.Linear(256, 1024)
    kept = []
    with MemorySiteSpy() as spy:
        for _ in range(3):
            scratch = torch.randn(64, 256)
            kept.append(linear(scratch))  # KEPT-HERE
    del scratch
    line = next(i for i, text in enumerate(open(__file__), 1) if text.rstrip().endswith("KEPT-HERE"))
    sites = spy.alive_sites()
    assert sites[0]["location"].endswith(f"test_memory.py:{line}")
    assert sites[0]["count"] == 3 and sites[0]["bytes"] == 3 * 64 * 1024 * 4


def test_bad_memory_options_are_rejected():
    with pytest.raises(ValueError, match="window_steps=0"):
        MemoryConfig(window_steps=0)
    with pytest.raises(ValueError, match="sample_every_s=-1"):
        MemoryConfig(sample_every_s=-1)
    with pytest.raises(ValueError, match="memory='on'"):
        ProfilerConfig(memory="on")


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


def test_memory_off_writes_no_memory_fields(tmp_path):
    prof = StepProfiler(tmp_path, memory=None, log_every_n_steps=5, **QUIET)
    with prof:
        for _ in range(10):
            prof.step()
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
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
    assert sites[0]["location"].endswith(f"test_memory.py:{line}") and sites[0]["count"] == 3
    assert torch.ones(2).sum().item() == 2.0  # no dispatch mode left behind


def test_lightning_out_of_memory_reaches_the_findings_file(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 7:
                raise MemoryError("cannot allocate")
            return self.linear(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callback = ProfilerCallback(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    trainer = pl.Trainer(max_steps=20, accelerator="cpu", logger=False, callbacks=[callback],
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    with pytest.raises(MemoryError):
        trainer.fit(Module(), torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=2))
    written = [json.loads(line) for line in findings_file(tmp_path, 0).read_text().splitlines()]
    assert [(f["kind"], f["step"]) for f in written] == [(OUT_OF_MEMORY, 7)]


def test_hf_out_of_memory_when_close_is_called_in_except(tmp_path):
    transformers = pytest.importorskip("transformers")
    from profcallbacks.hf import ProfilerCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 6:
                raise MemoryError("cannot allocate")
            return {"loss": self.linear(x).sum()}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return {"x": torch.randn(4)}

    callback = ProfilerCallback(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Data(),
                                   callbacks=[callback])
    try:
        trainer.train()
    except MemoryError:
        callback.close()
    written = [json.loads(line) for line in findings_file(tmp_path, 0).read_text().splitlines()]
    assert [(f["kind"], f["step"]) for f in written] == [(OUT_OF_MEMORY, 5)]


@pytest.mark.parametrize(("sample_every_s", "sampled_at"), [(0.0, [4, 9, 14, 19]), (1.0, [4, 14])])
def test_memory_numbers_reach_the_sinks_at_summaries_at_most_once_per_interval(
        tmp_path, sample_every_s, sampled_at):
    from profcallbacks import ProfilingSession, RankInfo

    seen = []
    now = [0.0]
    config = ProfilerConfig(log_every_n_steps=5, memory=MemoryConfig(sample_every_s=sample_every_s),
                            **QUIET)
    session = ProfilingSession(config, tmp_path, rank=RankInfo(), clock=lambda: now[0],
                               metrics_sinks=[lambda values, step: seen.append((step, values))])
    session.open()
    for step in range(20):
        now[0] = step * 0.11  # a summary every 0.55 s
        session.step_end()
    session.close()
    assert [step for step, values in seen if "profcallbacks/process_rss_mb" in values] == sampled_at
    rows = [json.loads(line) for line in steps_file(tmp_path, 0).read_text().splitlines()]
    assert [row["last_step"] for row in rows if "process_rss_mb" in row] == sampled_at


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
