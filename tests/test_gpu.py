"""Checks that need a CUDA device (``pytest -m gpu``); skipped without one."""

import gzip
import json

import pytest
import torch

from profcallbacks import Schedule, StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import audit_findings_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def busy_step(model, opt, x, sync):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if sync:
        return loss.item()  # SYNC: gpu-item
    return None


def run(tmp_path, steps, sync, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device="cuda")
    prof = StepProfiler(tmp_path, tensorboard_scalars=False, watch_capture_file=False, **options)
    with prof:
        for _ in range(steps):
            busy_step(model, opt, x, sync)
            prof.step()
    torch.cuda.synchronize()
    return prof


def test_item_on_cuda_is_a_blocking_warning_at_its_line(tmp_path):
    from sync_scenario import location

    prof = run(tmp_path, 8, sync=True, schedule=None, sync_audit=SyncAuditConfig(at_step=3))
    (site,) = [f for f in audit_findings_of(prof.findings)]
    assert site.details["location"] == location("gpu-item", __file__)
    assert site.severity == "warning" and site.details["on_device"] is True
    assert site.details["blocking_ms_per_step"] > 0.05


def test_profiled_steps_add_no_sync(tmp_path):
    """Under sync_debug_mode="error", any sync profcallbacks added to the steps would raise.

    The run has a capture window (steps 3-5) and a long stretch outside it, so both the profiled
    steps and the plain ones are covered; the window is stopped and exported after the loop.
    """
    torch.cuda.set_sync_debug_mode("error")
    try:
        prof = run(tmp_path, 12, sync=False, schedule=Schedule(skip_first=2, warmup=1, active=3),
                   sync_audit=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [p.name for p in prof.captures] == ["step000003-schedule"]


def test_capture_holds_cuda_activity_and_the_users_sync(tmp_path):
    prof = run(tmp_path, 8, sync=True, schedule=Schedule(skip_first=2, warmup=1, active=2),
               sync_audit=False)
    (capture,) = prof.captures
    (path,) = capture.glob("*.pt.trace.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith(CUDA_SYNCS)]
    assert kernels and syncs
    assert max(e.get("dur", 0) for e in syncs) > 10  # microseconds blocked waiting for kernels


def test_device_step_time_from_cuda_events_adds_no_sync(tmp_path):
    from profcallbacks import ProfilerConfig, ProfilingSession, RankInfo

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048, device="cuda")
    got = []
    config = ProfilerConfig(schedule=None, tensorboard_scalars=False, sync_audit=False,
                            watch_capture_file=False, log_every_n_steps=5)
    session = ProfilingSession(config, tmp_path, rank=RankInfo(),
                               metrics_sinks=[lambda values, step: got.append(values)])
    session.open()
    torch.cuda.set_sync_debug_mode("error")  # any sync inside the loop raises
    try:
        for _ in range(40):
            busy_step(model, opt, x, sync=False)
            session.step_end()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    session.close()
    device = [v["profcallbacks/device_step_time_ms"] for v in got
              if "profcallbacks/device_step_time_ms" in v]
    assert device and all(ms > 0 for ms in device)
