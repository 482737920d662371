"""Dataloader stalls: scripted loops with a fake clock, and one real loop with a slow loader."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import ProfilerConfig, ProfilingSession, StallConfig, StepProfiler
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.timing import StepRecord
from profcallbacks.detect.loaders import describe_loader
from profcallbacks.detect.stall import StallDetector
from profcallbacks.run.defaults import default_detectors
from profcallbacks.testing import FakeClock


def scripted_session(tmp_path, waits, compute_s=0.010, pause_at=(), loader=None, stall=StallConfig()):
    """Runs one step per entry of ``waits`` (seconds of data wait) on a fake clock."""
    clock = FakeClock()
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, watch_capture_file=False,
                            slowdown=None, sync_audit=False, stall=stall)
    rank = RankInfo(rank=0, local_rank=0, world_size=1, host="test-host")
    session = ProfilingSession(config, tmp_path, rank=rank, clock=clock,
                               detectors=default_detectors(config, rank))
    session.open()
    if loader is not None:
        session.set_loader(loader)
    for i, wait in enumerate(waits):
        if i in pause_at:
            session.pause()
            clock.now += 5.0
            session.resume()
        clock.now += wait
        session.data_wait(wait)
        clock.now += compute_s
        session.step_end()
    session.close()
    return session.findings


def of(findings, kind):
    return [f for f in findings if f.kind == kind]


def share_waits(share, steps, compute_s=0.010):
    return [compute_s * share / (1 - share)] * steps


# The scripted tests below judge the window statistic on runs of ~1 s (steps of 10-20 ms): they
# shorten the wall-time hold to HOLD_S (tests/test_stall_hold.py tests the default hold).
HOLD_S = 0.5
SHORT_HOLD = StallConfig(min_duration_s=HOLD_S)


def test_loader_at_30_percent_is_flagged_within_50_steps_once(tmp_path):
    findings = scripted_session(tmp_path, share_waits(0.30, 300), stall=SHORT_HOLD)
    (stall,) = of(findings, "dataloader_stall")
    assert stall.step < 50 and stall.severity == "warning"
    assert stall.details["share"] == pytest.approx(0.30, abs=1e-3)
    assert stall.details["data_wait_ms_per_step"] == pytest.approx(10 * 0.3 / 0.7, rel=1e-3)
    assert stall.details["first_step"] >= 1 and stall.details["steps"] >= 20
    assert not of(findings, "dataloader_stall_cleared")


@pytest.mark.parametrize("share", [0.0, 0.02, 0.05])
def test_loader_at_5_percent_or_less_is_never_flagged(tmp_path, share):
    waits = share_waits(share, 400)
    waits[0] = 2.0        # worker start-up: the first batch is slow
    waits[150] = 0.3      # a one-off hiccup
    findings = scripted_session(tmp_path, waits, pause_at=(200,))
    assert not of(findings, "dataloader_stall")
    notes = of(findings, "dataloader_wait")
    assert [(f.step, f.details["pattern"], f.severity) for f in notes] == [
        (0, "startup", "info"), (150, "isolated", "info")]


def test_bursty_multiworker_loader_is_flagged_with_fitting_advice(tmp_path):
    loader = DataLoader(range(64), batch_size=4, num_workers=4, prefetch_factor=2)
    waits = [0.030 if i % 4 == 0 else 0.0 for i in range(120)]   # one burst per 4 steps: 43%
    findings = scripted_session(tmp_path, waits, loader=loader, stall=SHORT_HOLD)
    (stall,) = of(findings, "dataloader_stall")
    assert stall.step < 50 and stall.details["bursty"] is True
    assert stall.details["share"] == pytest.approx(0.03 / 0.07, rel=1e-3)
    assert stall.details["loader"]["num_workers"] == 4
    assert any("prefetch_factor" in a for a in stall.details["advice"])
    assert not of(findings, "dataloader_wait")   # bursts are not "isolated" hiccups


def test_median_of_blocks_ignores_a_single_huge_hiccup_in_the_window(tmp_path):
    waits = share_waits(0.05, 60)
    waits[30] = 10.0      # 10 s once: the mean share over the window would be ~98%
    findings = scripted_session(tmp_path, waits)
    assert not of(findings, "dataloader_stall")
    assert [f.step for f in of(findings, "dataloader_wait")] == [30]


def test_stall_episode_clears_with_a_note_and_a_new_episode_is_a_new_finding(tmp_path):
    waits = share_waits(0.4, 60) + share_waits(0.01, 60) + share_waits(0.5, 60)
    findings = scripted_session(tmp_path, waits, stall=SHORT_HOLD)
    kinds = [f.kind for f in findings if f.kind.startswith("dataloader_stall")]
    assert kinds == ["dataloader_stall", "dataloader_stall_cleared", "dataloader_stall"]
    cleared = of(findings, "dataloader_stall_cleared")[0]
    assert cleared.severity == "info" and cleared.details["first_step"] <= 1
    assert 60 <= cleared.details["last_step"] < 90
    assert cleared.details["episode_share"] == pytest.approx(0.4, abs=0.1)


def test_captured_and_post_pause_steps_stay_out_of_the_statistic():
    detector = StallDetector(StallConfig(window=8, block_steps=2))
    records = [StepRecord(i, 0.010, 0.009, excluded=True) for i in range(50)]
    records += [StepRecord(50 + i, 0.010, 0.009, after_pause=True) for i in range(50)]
    assert [f for r in records for f in detector.observe(r) if f.kind == "dataloader_stall"] == []


def test_num_workers_raises_the_block_length():
    detector = StallDetector(StallConfig(window=20, block_steps=4, min_duration_s=0))
    detector.set_loader(describe_loader(DataLoader(range(8), num_workers=8)))
    findings = [f for i in range(40) for f in detector.observe(StepRecord(i, 0.01, 0.005))]
    (stall,) = findings
    assert stall.details["block_steps"] == 8 and stall.step == 23   # 3 blocks of 8 steps


@pytest.mark.parametrize("kwargs, words", [
    ({"share_threshold": 0}, "share_threshold"), ({"window": 0}, "window=0"),
    ({"share_threshold": 0.2, "clear_share": 0.5}, "clear_share"),
    ({"block_steps": 1.5}, "block_steps"), ({"max_isolated_reports": -1}, "max_isolated_reports")])
def test_bad_stall_config_names_the_parameter(kwargs, words):
    with pytest.raises(ValueError, match=words):
        StallConfig(**kwargs)


class SlowDataset(Dataset):
    def __init__(self, delay_s):
        self.delay_s = delay_s

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.ones(4)


@pytest.mark.parametrize("delay_s, flagged", [(0.015, True), (0.001, False)])
def test_real_loop_with_sleeping_loader(tmp_path, delay_s, flagged):
    """num_workers=0: 15 ms of loading against 25 ms of work is ~38%; 1 ms is ~4%. A 1 s hold
    (60 steps are 2.4 s; a shorter hold only makes the 4% run more likely to alert)."""
    loader = DataLoader(SlowDataset(delay_s), batch_size=1)
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, sync_audit=False,
                        stall=StallConfig(min_duration_s=1.0))
    with prof:
        for i, _ in enumerate(prof.wrap(loader)):
            time.sleep(0.025)
            prof.step()
            if i == 59:
                break
    stalls = of(prof.findings, "dataloader_stall")
    assert bool(stalls) is flagged
    if flagged:
        assert stalls[0].step < 50 and stalls[0].details["loader"]["num_workers"] == 0
        assert "num_workers=0" in stalls[0].details["advice"][0]


def test_advice_names_the_collate_function_inside_known_wrappers():
    """The HF Trainer wraps its collator in RemoveColumnsCollator: the advice names what is inside."""
    import functools

    transformers = pytest.importorskip("transformers")
    default_data_collator = transformers.default_data_collator
    from transformers.trainer_utils import RemoveColumnsCollator

    from profcallbacks.detect.loaders import stall_advice

    def pad_and_stack(batch):
        return batch

    hf_default = RemoveColumnsCollator(default_data_collator, signature_columns=["x"])
    info = describe_loader(DataLoader(range(8), collate_fn=hf_default))
    assert info["collate_fn"] == "default_data_collator"
    assert info["collate_wrappers"] == ["RemoveColumnsCollator"]
    assert not any("collate" in a for a in stall_advice(info, bursty=False))

    custom = RemoveColumnsCollator(functools.partial(pad_and_stack), signature_columns=["x"])
    info = describe_loader(DataLoader(range(8), collate_fn=custom))
    assert info["collate_fn"] == "pad_and_stack"
    (advice,) = [a for a in stall_advice(info, bursty=False) if "collate" in a]
    assert advice == ("profile the custom collate_fn (pad_and_stack, called through "
                      "RemoveColumnsCollator > partial): it runs per batch")


def test_logged_stall_says_its_kind_once(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="profcallbacks"):
        findings = scripted_session(tmp_path, share_waits(0.4, 60) + share_waits(0.01, 60),
                                    stall=SHORT_HOLD)
    assert [f.kind for f in findings] == ["dataloader_stall", "dataloader_stall_cleared"]
    logged = [r.getMessage() for r in caplog.records if "dataloader_stall" in r.getMessage()]
    assert len(logged) == 2, logged
    assert logged[0].startswith("[rank 0 step ") and "] dataloader_stall: 40% of step time" in logged[0]
    assert "] dataloader_stall_cleared: data wait is down to 1%" in logged[1]
    assert not any("dataloader stall" in m for m in logged)


def test_log_finding_drops_a_repeated_kind_from_old_style_messages(caplog):
    import logging

    from profcallbacks.findings import Finding, log_finding

    with caplog.at_level(logging.INFO, logger="profcallbacks"):
        log_finding(Finding("dataloader_stall", 3, 0, "warning", "Dataloader stall: 40% waiting"))
        log_finding(Finding("sync_point", 3, 0, "info", "host-device sync point at x.py:1"))
    assert [r.getMessage() for r in caplog.records] == [
        "[rank 0 step 3] dataloader_stall: 40% waiting",
        "[rank 0 step 3] sync_point: host-device sync point at x.py:1"]


@pytest.mark.parametrize("compute_s", [0.0003, 0.003])
def test_steady_fast_loader_on_real_short_steps_is_never_a_stall(tmp_path, compute_s):
    """A real loop (3 s here; benchmarks/slowdown_real.py runs 30 s) with an in-memory loader:
    machine jitter in short steps is not a stall."""
    batches = [torch.randn(16, 8) for _ in range(32)]
    model = torch.nn.Linear(8, 1)
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, sync_audit=False)
    end = time.perf_counter() + 3.0
    with prof:
        while time.perf_counter() < end:
            for x in prof.wrap(batches):
                model(x).sum().backward()
                spin_until = time.perf_counter() + compute_s
                while time.perf_counter() < spin_until:
                    pass
                prof.step()
    assert of(prof.findings, "dataloader_stall") == []
