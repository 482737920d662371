"""Sync audits that cannot be missed: whatever the callback order, and saying what ran and when."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from profcallbacks import StepProfiler, SyncAuditConfig
from profcallbacks.cli import main
from profcallbacks.detect.sync_audit import audit_findings_of
from profcallbacks.findings import SYNC_AUDIT
from profcallbacks.report import build_report, locate_run
from profcallbacks.report.render.text import render_text
from sync_scenario import location

OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
               watch_capture_file=False, memory=None)


class CallbackTrainer:
    """The shape of minGPT's Trainer: per iteration forward, backward, optimizer step, then
    every ``on_batch_end`` callback in the order they were added, then ``iter_num += 1``."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 1)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.callbacks: dict[str, list] = defaultdict(list)
        self.iter_num = 0
        self.loss = torch.zeros(())

    def add_callback(self, event: str, callback) -> None:
        self.callbacks[event].append(callback)

    def run(self, max_iters: int) -> None:
        while self.iter_num < max_iters:
            self.loss = self.model(torch.randn(16, 8)).pow(2).mean()
            self.model.zero_grad(set_to_none=True)
            self.loss.backward()
            self.optimizer.step()
            for callback in self.callbacks["on_batch_end"]:
                callback(self)
            self.iter_num += 1


def log_every_10(trainer: CallbackTrainer, seen: list[float]) -> None:
    if trainer.iter_num % 10 == 0:
        seen.append(trainer.loss.item())  # SYNC: every-10


@pytest.mark.parametrize("ours_first, seen_at", [(True, [21]), (False, [20])])
def test_periodic_item_is_found_whatever_the_callback_order(tmp_path, ours_first, seen_at):
    """Our step first (the natural order): the user's work of iteration 20 lands in step 21."""
    prof = StepProfiler(tmp_path, sync_audit=True, **OPTIONS)
    trainer = CallbackTrainer()
    seen: list[float] = []
    callbacks = [lambda t: prof.step(), lambda t: log_every_10(t, seen)]
    for callback in callbacks if ours_first else callbacks[::-1]:
        trainer.add_callback("on_batch_end", callback)
    with prof:
        trainer.run(40)
    (site,) = audit_findings_of(prof.findings)
    assert site.details["location"] == location("every-10", __file__)
    assert site.details["op"] == "item" and site.details["seen_at_steps"] == seen_at
    status, ended = [f for f in prof.findings if f.kind == SYNC_AUDIT]
    assert status.details["audited_steps"] == [19, 20, 21] and status.details["ran"]
    assert status.message == ("sync audit ran at steps 19, 20, 21: 1 new call site (sync_point); "
                              "next audit at step 99.")
    assert ended.message == ("sync audit: the run ended at step 39, before the next audit "
                             "(steps 99, 100, 101 were to be audited).")


def train(logdir, steps: int) -> StepProfiler:
    model = torch.nn.Linear(4, 1)
    prof = StepProfiler(logdir, sync_audit=True, **OPTIONS)
    with prof:
        for _ in range(steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            loss.item()  # SYNC: each-step
            prof.step()
    return prof


def test_a_run_that_ends_before_the_first_audit_says_so_in_report_and_watch(tmp_path, capsys):
    prof = train(tmp_path, 15)
    (status,) = [f for f in prof.findings if f.kind == SYNC_AUDIT]
    assert status.step == 14 and not status.details["ran"]
    assert status.message == ("sync audit: the run ended at step 14, before the first audit "
                              "(steps 19, 20, 21 were to be audited); steps 99, 100, 101 were not "
                              "audited either.")
    text = render_text(build_report(locate_run(tmp_path)))
    assert "sync_audit (info): 1 finding(s), step 14, rank(s) 0" in text
    assert "the run ended at step 14, before the first audit" in text
    capsys.readouterr()
    assert main(["watch", str(tmp_path), "--once"]) == 0
    assert "checks: sync audit: the run ended at step 14, before the first audit" in \
        " ".join(capsys.readouterr().out.split())


def test_a_run_that_ends_during_the_audit_reports_what_the_audited_steps_saw(tmp_path):
    prof = train(tmp_path, 20)  # steps 0-19: step 19 of the round 19-21 is audited
    (site,) = audit_findings_of(prof.findings)
    assert site.details["location"] == location("each-step", __file__)
    assert site.details["audited_steps"] == [19] and site.step == 19
    (status,) = [f for f in prof.findings if f.kind == SYNC_AUDIT]
    assert status.details["audited_steps"] == [19] and status.details["ran"]
    assert "cut short: the run ended at step 19, during the audit; steps 99, 100, 101 were not " \
           "audited" in status.message


def test_every_round_says_when_it_ran(tmp_path):
    prof = train(tmp_path, 110)
    statuses = [f for f in prof.findings if f.kind == SYNC_AUDIT]  # none at the end: all ran
    assert [(f.step, f.details["audited_steps"]) for f in statuses] == [
        (21, [19, 20, 21]), (101, [99, 100, 101])]
    assert statuses[-1].message == "sync audit ran at steps 99, 100, 101: no new sync point."


def test_an_audit_given_up_says_why(tmp_path):
    model = torch.nn.Linear(4, 1)
    prof = StepProfiler(tmp_path, sync_audit=SyncAuditConfig(at_step=2, steps=1), **OPTIONS)
    with prof:
        for step in range(30):
            for _ in range(12 if step == 2 else 0):  # pauses cut the audit of step 2 short
                prof.pause()
                prof.resume()
            model(torch.randn(8, 4)).sum().backward()
            prof.step()
    (status,) = [f for f in prof.findings if f.kind == SYNC_AUDIT]
    assert not status.details["ran"] and status.step == 2
    assert status.message == ("sync audit: cut short by pauses 10 times at step 2, given up "
                              "(step 2 was to be audited); step 99 was not audited either.")


def test_more_rounds_than_the_give_up_count_all_run(tmp_path):
    """Only starts cut short by pauses count towards giving up, not the audited steps that ran
    (five 3-step rounds were given up at their tenth step)."""
    model = torch.nn.Linear(4, 1)
    audit = SyncAuditConfig(at_step=5, repeat_at=(15, 25, 35, 45))
    prof = StepProfiler(tmp_path, sync_audit=audit, **OPTIONS)
    with prof:
        for _ in range(50):
            model(torch.randn(8, 4)).sum().backward()
            prof.step()
    statuses = [f for f in prof.findings if f.kind == SYNC_AUDIT]
    assert [f.details["audited_steps"] for f in statuses] == [
        [s, s + 1, s + 2] for s in (5, 15, 25, 35, 45)], [f.message for f in statuses]


def test_legend_colours_are_distinct_per_kind(tmp_path):
    from profcallbacks.findings import CAPTURE_VERDICT, SLOWDOWN_DIAGNOSIS, SYNC_POINT
    from profcallbacks.report.render.html import render_html
    from profcallbacks.report.render.plot import finding_colours

    kinds = {CAPTURE_VERDICT, SYNC_POINT, SLOWDOWN_DIAGNOSIS, SYNC_AUDIT, "mine", "yours"}
    colours = finding_colours(kinds)
    assert len(set(colours.values())) == len(kinds)
    train(tmp_path, 25)  # a sync_point and a sync_audit finding
    html = render_html(build_report(locate_run(tmp_path)))
    legend = html[html.index('<div class="legend">'):]
    for kind in (SYNC_POINT, SYNC_AUDIT):
        assert f'<i style="background:{colours[kind]}"></i>{kind}</span>' in legend
