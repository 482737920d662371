#!/usr/bin/env bash
# GPU check (a few minutes on one NVIDIA GPU): real sync detection with blocking time, no syncs added
# by profcallbacks, CUDA activity in traces, memory (allocator numbers without syncs, creep on
# cuda_allocated, sites and the CUDA memory snapshot of a memory capture, out_of_memory).
# Usage: scripts/gpu_check.sh   (needs a CUDA torch build)
set -uo pipefail
cd "$(dirname "$0")/.."
python - <<'PY' || { echo "SUMMARY: no CUDA device, nothing checked"; exit 2; }
import torch, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, "device:",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
sys.exit(0 if torch.cuda.is_available() else 1)
PY
python -m pytest -m gpu tests/test_gpu.py tests/test_gpu_memory.py -q -p no:cacheprovider -rA 2>&1 | tail -15
tests_rc=${PIPESTATUS[0]}
python - <<'PY'
"""Measured numbers: step time bare vs profiled (no capture), and the audit's blocking time."""
import tempfile, time
import torch
from profcallbacks import StepProfiler, SyncAuditConfig

model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-5)
x = torch.randn(1024, 4096, device="cuda")
def step():
    loss = model(x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    return loss
def timed(prof, n=40):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n):
        step()
        if prof: prof.step()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e3
for _ in range(5): step()
bare = timed(None)
with StepProfiler(tempfile.mkdtemp(), schedule=None, tensorboard_scalars=False,
                  sync_audit=False) as prof:
    profiled = timed(prof)
print(f"step time: bare {bare:.2f} ms, profiled (no window) {profiled:.2f} ms, ratio {profiled / bare:.3f}")
with StepProfiler(tempfile.mkdtemp(), schedule=None, tensorboard_scalars=False,
                  sync_audit=SyncAuditConfig(at_step=2)) as prof:
    for _ in range(5):
        step().item(); prof.step()
for f in prof.findings:
    if f.kind == "sync_point":
        print(f"sync_point {f.severity}: {f.details['location']} {f.details['op']} "
              f"{f.details['calls_per_step']}/step blocking {f.details['blocking_ms_per_step']} ms/step"
              f"{' (library ' + f.details['library'] + ')' if f.details['library'] else ''}")
PY
script_rc=$?
echo "SUMMARY: pytest -m gpu rc=$tests_rc, measurement script rc=$script_rc"
[ "$tests_rc" -eq 0 ] && [ "$script_rc" -eq 0 ]
