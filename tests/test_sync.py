"""Host-device sync points: exact user lines, library sites, allowlist, audit scheduling."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import SyncAuditor, audit_findings_of
from profcallbacks.detect.sync_spy import SyncSpy
from sync_scenario import EXPECTED, location, scenario_loss

AUDIT = SyncAuditConfig(at_step=2)


def run(tmp_path, steps=8, audit=AUDIT, schedule=None, body=None, pause_after=-1,
        while_paused=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    prof = StepProfiler(tmp_path, schedule=schedule, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, sync_audit=audit)
    with prof:
        for i in range(steps):
            loss, _ = (body or scenario_loss)(model, torch.randn(8, 4))
            opt.zero_grad()
            loss.backward()
            opt.step()  # SYNC: optimizer
            prof.step()
            if i == pause_after:
                prof.pause()
                if while_paused:
                    while_paused()
                prof.resume()
    return prof


def user_sites(findings):
    return {(f.details["location"], f.details["op"]) for f in audit_findings_of(findings)}


def test_item_and_nonzero_are_found_on_their_exact_lines(tmp_path):
    prof = run(tmp_path)
    assert user_sites(prof.findings) == EXPECTED
    for f in audit_findings_of(prof.findings):
        assert f.severity == "info" and "would sync on an accelerator" in f.message
        assert f.details["calls_per_step"] == 1 and f.details["audited_steps"] == [2, 3]
        assert f.step == 3


def test_optimizer_item_calls_are_one_library_site_at_the_users_step_call(tmp_path):
    prof = run(tmp_path)
    library = [f for f in prof.findings if f.kind == "sync_point" and f.details["library"]]
    assert [f.details["library"] for f in library] == ["torch"]
    (site,) = library
    assert site.details["location"] == location("optimizer", __file__)
    assert site.details["op"] == "item" and site.details["calls_per_step"] >= 1
    assert all("torch/optim" in where for where in site.details["library_sites"])


def test_allowlist_silences_a_line_or_a_file(tmp_path):
    audit = SyncAuditConfig(at_step=2, allow=(location("item"),))
    assert user_sites(run(tmp_path / "a", audit=audit).findings) == {
        (location("nonzero"), "nonzero")}
    audit = SyncAuditConfig(at_step=2, allow=("sync_scenario.py",))
    assert user_sites(run(tmp_path / "b", audit=audit).findings) == set()


def other_syncs(model, x):
    out = model(x)
    mask = out > 0
    picked = out[mask]  # SYNC: mask
    if out.sum() > 0:  # SYNC: if
        pass
    listed = out.detach().tolist()  # SYNC: tolist
    array = out.detach().cpu().numpy()  # SYNC: numpy
    return out.pow(2).mean() + 0.0 * picked.sum() + 0.0 * len(listed) * float(array.size > 0), 0.0


def test_mask_indexing_if_tensor_tolist_and_numpy_would_sync(tmp_path):
    here = __file__
    found = user_sites(run(tmp_path, body=other_syncs).findings)
    assert {(location("mask", here), "boolean mask indexing"), (location("if", here), "bool(tensor)"),
            (location("tolist", here), "tolist")} <= found
    assert any(loc == location("numpy", here) and "numpy" in op for loc, op in found)


def test_audit_waits_for_the_capture_window_to_end_and_is_not_timed_as_a_normal_step(tmp_path):
    prof = run(tmp_path, steps=10, schedule=Schedule(skip_first=2, warmup=1, active=2),
               audit=SyncAuditConfig(at_step=2, steps=2))
    (first, *_) = audit_findings_of(prof.findings)
    assert first.details["audited_steps"] == [5, 6]      # window: warmup 2, active 3-4
    assert [p.name for p in prof.captures] == ["step000003-schedule"]


def test_pause_keeps_work_between_steps_out_of_the_audit(tmp_path):
    def evaluate():
        torch.ones(1).item()  # between steps: not part of step 2

    prof = run(tmp_path, audit=SyncAuditConfig(at_step=2, steps=1), pause_after=1,
               while_paused=evaluate)
    # step 2's audit began at the end of step 1, stopped for the pause, and began again at
    # resume(): step 2 is audited, without what ran while paused
    (first, *_) = audit_findings_of(prof.findings)
    assert first.details["audited_steps"] == [2]
    assert user_sites(prof.findings) == EXPECTED


def test_no_audit_no_findings(tmp_path):
    prof = run(tmp_path, audit=False)
    assert [f for f in prof.findings if f.kind == "sync_point"] == []


def test_audit_leaves_no_patch_behind(tmp_path):
    methods = ("tolist", "numpy", "cpu")
    before = {name: torch.Tensor.__dict__.get(name) for name in methods}
    resolved = {name: getattr(torch.Tensor, name) for name in methods}
    prof = run(tmp_path, audit=SyncAuditConfig(at_step=1, steps=2))
    assert audit_findings_of(prof.findings)  # the audit did run (and patched)
    assert {name: torch.Tensor.__dict__.get(name) for name in methods} == before
    assert {name: getattr(torch.Tensor, name) for name in methods} == resolved


def test_profcallbacks_itself_adds_no_sync_point(tmp_path):
    """The same loop run bare and profiled (a capture window, a wrapped loader, every detector):
    a spy over each sees exactly the same sync ops (the DataLoader's own seed item())."""
    def loop(prof):
        model, opt = tiny_model()
        loader = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=4)
        with SyncSpy() as spy:
            for _ in (prof.wrap(loader) if prof else loader):
                train_step(model, opt)
                if prof:
                    prof.step()
        return {key: (site.calls, sorted(site.library_sites)) for key, site in spy.sites.items()}

    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=2, warmup=1, active=2),
                        tensorboard_scalars=False, watch_capture_file=False, sync_audit=False,
                        log_every_n_steps=3)
    bare = loop(None)
    with prof:
        profiled = loop(prof)
    assert [p.name for p in prof.captures] == ["step000003-schedule"]
    assert profiled == bare
    assert not any("profcallbacks" in where for _, sites in profiled.values() for where in sites)


def test_auditor_restores_everything_when_cancelled():
    auditor = SyncAuditor(SyncAuditConfig(at_step=0, steps=1))
    auditor.begin_step(0)
    assert "tolist" in torch.Tensor.__dict__
    auditor.cancel()
    assert "tolist" not in torch.Tensor.__dict__ and auditor.next_step == 0


@pytest.mark.parametrize("kwargs, words", [({"steps": 0}, "steps"), ({"allow": "x.py"}, "allow"),
                                           ({"at_step": -1}, "at_step"),
                                           ({"warn_blocking_ms": -1}, "warn_blocking_ms")])
def test_bad_audit_config_names_the_parameter(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SyncAuditConfig(**kwargs)
