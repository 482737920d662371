"""Host-device sync points on real loops: exact user lines, library sites, allowlist, audit scheduling."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import tiny_model, train_step
from profcallbacks import Schedule, StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import audit_findings_of
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
        assert f.details["calls_per_step"] == 1 and f.details["audited_steps"] == [2, 3, 4]
        assert f.step == 4


OPTIMIZERS = {
    "sgd-momentum": lambda p, foreach: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=foreach),
    "adam": lambda p, foreach: torch.optim.Adam(p, lr=1e-3, foreach=foreach),
    "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=1e-3, foreach=foreach),
    "rmsprop": lambda p, foreach: torch.optim.RMSprop(p, lr=1e-3, foreach=foreach),
}


def optimizer_loop(tmp_path, make_opt, steps=6, body=None, audit=AUDIT, schedule=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = make_opt(model.parameters())
    prof = StepProfiler(tmp_path, schedule=schedule, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, stall=None, sync_audit=audit)
    with prof:
        for i in range(steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if body is not None:
                body(i, loss)
            prof.step()
    return [f for f in prof.findings if f.kind == "sync_point"]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_host_step_counters_are_not_sync_points_on_a_cpu_run(tmp_path, name, foreach):
    """Adam/AdamW/RMSprop call item() on host-side step counters (never a sync on a GPU either):
    a loop with no sync of its own gets no sync_point finding."""
    found = optimizer_loop(tmp_path, lambda p: OPTIMIZERS[name](p, foreach))
    assert found == []


def test_a_real_item_on_the_loss_is_still_found_at_its_line_next_to_adamw(tmp_path):
    def body(i, loss):
        loss.item()  # SYNC: loss-item

    found = optimizer_loop(tmp_path, lambda p: OPTIMIZERS["adamw"](p, False), body=body)
    (site,) = found
    assert site.details["location"] == location("loss-item", __file__)
    assert site.details["op"] == "item" and site.details["library"] is None
    assert "trainable parameters" in site.details["decided_by"]


def test_host_index_tensors_for_data_loading_are_not_reported(tmp_path):
    """nanoGPT's get_batch: a CPU index tensor indexes a numpy array (item() per index)."""
    import numpy as np

    data = np.arange(10_000, dtype=np.int64)

    def get_batch():
        ix = torch.randint(len(data) - 9, (8,))
        x = torch.stack([torch.from_numpy(data[i:i + 8].astype(np.float32)) for i in ix])
        return x[:, :4]

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, stall=None, sync_audit=AUDIT)
    with prof:
        for _ in range(6):
            loss = model(get_batch()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    assert [f for f in prof.findings if f.kind == "sync_point"] == []


def periodic(i, loss):
    if i % 10 == 0:
        loss.item()  # SYNC: every-10
    if (i + 1) % 50 == 0:
        float(loss.detach())  # SYNC: every-50
    if i % 100 == 0:
        loss.detach().tolist()  # SYNC: every-100


@pytest.mark.parametrize("schedule, audited", [
    (None, [19, 20, 21]), (Schedule(), [19, 20, 21]),  # window 10-13
    (Schedule(skip_first=10, warmup=1, active=5, repeat=2), [29, 30, 31])])  # the README's: 10-21
def test_work_done_every_10_50_or_100_steps_is_seen_by_the_default_audit(tmp_path, schedule,
                                                                         audited):
    found = optimizer_loop(tmp_path, lambda p: OPTIMIZERS["adam"](p, False), steps=101,
                           body=periodic, audit=SyncAuditConfig(), schedule=schedule)
    here = __file__
    sites = {f.details["location"]: f for f in found}
    assert set(sites) == {location(m, here) for m in ("every-10", "every-50", "every-100")}
    assert sites[location("every-10", here)].details["audited_steps"] == audited
    assert sites[location("every-10", here)].details["seen_at_steps"] == [audited[1]]
    assert sites[location("every-50", here)].details["seen_at_steps"] == [99]
    every_100 = sites[location("every-100", here)]
    assert every_100.details["seen_at_steps"] == [100] and every_100.step == 100
    # the run's last step is 100: the round of 99-101 is cut short and reports at the end
    assert every_100.details["audited_steps"] == audited + [99, 100]
    assert "periodic work" in every_100.message and "at step 100 of audited steps" in every_100.message


def test_library_site_details_name_the_library_line_and_op(tmp_path):
    """A sync inside a library (here: torch's clip_grad_norm_ with error_if_nonfinite=True)."""
    def body(i, loss):
        pass

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False, slowdown=None,
                        watch_capture_file=False, stall=None, sync_audit=AUDIT)
    with prof:
        for _ in range(5):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  # SYNC: clip
            opt.step()
            prof.step()
    (site,) = [f for f in prof.findings if f.kind == "sync_point"]
    assert site.details["library"] == "torch"
    assert site.details["location"] == location("clip", __file__)
    (lib,) = site.details["library_sites"]
    assert "torch/nn/utils/clip_grad.py:" in lib["location"] and lib["op"] == "bool(tensor)"
    assert "error_if_nonfinite" in lib["fix"] and lib["location"] in site.message


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
