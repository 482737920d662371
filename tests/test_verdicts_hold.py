"""Verdicts that hold: margins, materiality, one kind per run, ranks alike; advice that fits the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Schedule, StallConfig, StepProfiler
from profcallbacks.core.cpus import loader_workers
from profcallbacks.detect.loaders import stall_advice
from profcallbacks.findings import DATALOADER_STALL
from profcallbacks.report import build_report, locate_run, render_text
from profcallbacks.report.analyse.advice import RunContext, run_context, verdict_advice
from profcallbacks.report.analyse.verdict import KINDS, MARGIN, decide

GLOO_SCRIPT = Path(__file__).parent / "dist_scripts" / "gloo_ddp_plain.py"
GPU_WORDS = ("pin_memory", "GPU", "CUDA", "cuda", "non_blocking", "on the device")


def cpu_metrics(data_ms: float, ops_ms: float, step_ms: float = 100.0) -> dict:
    return {"step_ms": step_ms, "data_wait_ms": data_ms, "cpu_ops_ms": ops_ms, "sync_ms": 0.0,
            "comm_call_ms": 0.0, "comm_exposed_ms": 0.0, "gpu": None, "top_cpu_ops": []}


def test_a_small_wait_beside_a_cpu_bound_step_does_not_head_the_verdict():
    # the two captures of one run: 15.0% and 15.3% data wait, ~80% CPU operators
    first, second = decide(cpu_metrics(15.0, 80.0)), decide(cpu_metrics(15.3, 80.0))
    assert first["kind"] == second["kind"] == "cpu_compute_bound"
    assert second["secondary"] == [["input_bound", 0.153]]
    assert any("input_bound 15%" in line for line in second["evidence"])
    # a material wait still heads a compute-bound step
    assert decide(cpu_metrics(30.0, 65.0))["kind"] == "input_bound"


def test_close_calls_are_named_and_held_against_the_previous_capture():
    below, above = cpu_metrics(14.0, 40.0), cpu_metrics(16.0, 40.0)
    first = decide(below)
    assert first["kind"] == "balanced" and first["close_to"] == "input_bound"
    alone = decide(above)
    assert alone["kind"] == "input_bound" and alone["close_to"] == "balanced"
    held = decide(above, previous=first["kind"])
    assert held["kind"] == "balanced" and held["held"] and held["close_to"] == "input_bound"
    # beyond the margin the new kind wins whatever came before
    far = decide(cpu_metrics(100 * (0.15 + MARGIN) + 1, 40.0), previous="balanced")
    assert far["kind"] == "input_bound" and not far["held"] and far["close_to"] is None


def _trace(path: Path, data_us: float, ops_us: float, steps: int = 3) -> None:
    events, ts = [], 0.0
    for n in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1,
                       "tid": 1, "ts": ts, "dur": 1000.0})
        events.append({"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_It."
                       "__next__", "pid": 1, "tid": 1, "ts": ts + 1, "dur": data_us})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                       "ts": ts + 2 + data_us, "dur": ops_us})
        ts += 1000.0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events}))


def test_captures_of_one_run_either_side_of_a_threshold_keep_one_kind(tmp_path):
    _trace(tmp_path / "step000010-schedule" / "rank0_h.10.pt.trace.json", 140.0, 400.0)
    _trace(tmp_path / "step000050-schedule" / "rank0_h.50.pt.trace.json", 160.0, 400.0)
    report = build_report(locate_run(tmp_path))
    kinds = [c["verdict"]["kind"] for c in report["captures"]]
    assert kinds == ["balanced", "balanced"]
    assert report["captures"][1]["verdict"]["held"]
    assert report["verdict"]["kind"] == "balanced"
    assert "balanced / input_bound (close)" in render_text(report)


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_runs_never_get_gpu_advice(kind):
    cpu = RunContext(device="cpu", loader={"num_workers": 2, "pin_memory": False,
                                           "persistent_workers": False, "epoch_ends": True})
    if kind in ("sync_bound", "copy_bound", "gpu_compute_bound"):
        return  # GPU-only kinds: decide() never gives them without a GPU timeline
    for line in verdict_advice(kind, cpu):  # host_bound on a CPU: Python between operators
        assert not any(word in line for word in GPU_WORDS), line
        assert line.endswith("."), line  # a sentence: the live finding appends the next one


def test_loader_advice_fits_the_loader():
    endless = RunContext(device="cuda", loader={"num_workers": 4, "pin_memory": True,
                                                "persistent_workers": False, "epoch_ends": False})
    assert not any("persistent_workers" in line for line in verdict_advice("input_bound", endless))
    assert not any("pin_memory" in line for line in verdict_advice("input_bound", endless))
    epochs = RunContext(device="cuda", loader={"num_workers": 4, "pin_memory": False, "cpus": 8,
                                               "persistent_workers": False, "epoch_ends": True})
    line = verdict_advice("input_bound", epochs)[0]
    assert "from 4 to 8" in line and "persistent_workers=True" in line and "pin_memory=True" in line
    # one worker-count rule: a worker per core this process may use, whatever the loader had
    zero = RunContext(device="cpu", loader={"num_workers": 0, "cpus": 2})
    rule = "num_workers=2 (one per core the training process may use"
    assert rule in verdict_advice("input_bound", zero)[0]
    # the run's cores unknown: the rule in words, never the cores of the machine reading the trace
    unknown = verdict_advice("input_bound", RunContext(device="cpu", loader={"num_workers": 0}))[0]
    assert "one per core the training process may use (at most 8)" in unknown
    full = RunContext(device="cpu", loader={"num_workers": 2, "cpus": 2})
    assert "make each batch cheaper" in verdict_advice("input_bound", full)[0]
    v100 = verdict_advice("gpu_compute_bound", RunContext(device="cuda", capability=(7, 0)))[0]
    assert "fp16" in v100 and "(no bf16/TF32)" in v100
    a100 = verdict_advice("gpu_compute_bound", RunContext(device="cuda", capability=(8, 0)))[0]
    assert "TF32" in a100


def test_context_from_real_traces():
    data = Path(__file__).parent / "data"
    v100 = build_report(locate_run(data / "kineto-traces" / "resnet50_num_workers_0.pt.trace.json.gz"))
    assert v100["run_context"]["device"] == "cuda"
    assert v100["run_context"]["capability"] == [7, 0]
    assert v100["run_context"]["gpu_name"] == "Tesla V100-DGXS-32GB"
    amd = build_report(locate_run(data / "hta-traces" / "mi250_rocm62.pt.trace.json.gz"))
    assert amd["run_context"]["device"] == "rocm"
    cpu = build_report(locate_run(data / "hta-traces" / "cpu_only_no_distributed_info.pt.trace.json.gz"))
    assert cpu["run_context"]["device"] == "cpu"
    assert run_context([]).device == "unknown"


class SlowSamples(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.randn(64)


def test_stall_finding_and_verdict_share_one_piece_of_advice(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowSamples(), batch_size=2)
    prof = StepProfiler(tmp_path, schedule=Schedule(skip_first=6, warmup=1, active=3),
                        slowdown=None, stall=StallConfig(window=8), tensorboard_scalars=False,
                        watch_capture_file=False, sync_audit=False)
    with prof:
        for x in prof.wrap(loader):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    report = build_report(locate_run(tmp_path))
    assert report["verdict"]["kind"] == "input_bound"
    [stall] = [g for g in report["findings_by_kind"] if g["kind"] == DATALOADER_STALL]
    assert report["run_context"]["device"] == "cpu"
    assert report["run_context"]["loader"]["num_workers"] == 0
    assert stall["advice_in_verdict"]
    assert report["verdict"]["advice"][0].rstrip(".") == stall["advice"].rstrip(".")
    text = render_text(report)
    words = " ".join(text.split())
    first = stall["advice"].split(";")[0]
    assert words.count(first) == 1  # said once: in the verdict, the findings point there
    assert "Try:" not in words.split("Findings")[1]
    assert "pre-process once" not in words.split("Findings")[1]  # nor the live verdict's advice
    for line in report["verdict"]["advice"]:
        assert not any(word in line for word in GPU_WORDS), line


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo") / "traces"
    proc = subprocess.run([sys.executable, str(GLOO_SCRIPT), str(out)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return build_report(locate_run(out))


def test_gloo_ddp_with_heavy_all_reduce_is_communication_bound(gloo_run):
    report = gloo_run
    assert report["world_size"] == 2 and report["ranks"] == [0, 1]
    verdict = report["verdict"]
    # beside busy neighbours the host work (fill_, the SGD update of the dense gradient) stretches
    # with the all-reduce until the two can tie (host_bound 50.3% against 50% once, beside two
    # CPU burners): the verdict then names communication_bound as its close call. On a recorded
    # gloo trace, whose times do not move: tests/test_judgement_traces.py
    # (test_ranks_waiting_for_stragglers_are_told_so: communication_bound).
    assert "communication_bound" in (verdict["kind"], verdict["close_to"]), verdict
    assert verdict["share_of"] == "step" and verdict["share"] > 0.3
    [capture] = report["captures"]
    assert capture["metrics"]["comm_exposed_ms"] > 0.3 * capture["metrics"]["step_ms"]
    ranks = capture["rank_verdicts"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # ranks doing the same work: one kind, or the report says which rank differs and why
    assert len({r["kind"] for r in ranks}) == 1 or capture["ranks_differ"]
    for line in verdict["advice"]:
        assert not any(word in line for word in GPU_WORDS), line


def test_thread_advice_never_raises_threads_on_an_oversubscribed_machine():
    # a slowdown that grew every operator alike names the machine: more threads on cores other
    # work holds made every operator slower (1 thread was 10x faster than 2 on such a machine)
    uniform = {"kind": "slowdown_diagnosis", "details": {"growth": {"pattern": "uniform"}}}
    busy = run_context([], [uniform])
    assert busy.contended and busy.public()["contended"] is True
    [line] = verdict_advice("cpu_compute_bound", busy)
    assert "oversubscribed" in line and "Lower torch.set_num_threads" in line
    calm = verdict_advice("cpu_compute_bound", RunContext(device="cpu"))
    assert not any("raise torch.set_num_threads" in x.lower() for x in calm)


@pytest.mark.parametrize("cpus, workers", [(2, 0), (2, 1), (2, 2), (4, 2), (16, 4), (16, 8)])
def test_live_stall_advice_and_the_report_follow_one_worker_rule(cpus, workers):
    """The stall finding (live) and the report's input advice ask for the same number of workers
    for the same loader: one per core the training process may use (it was cores - 1 live)."""
    info = {"type": "DataLoader", "num_workers": workers, "cpus": cpus}
    live = " ".join(stall_advice(info, bursty=False))
    report = verdict_advice("input_bound", RunContext(device="cpu", loader=info))[0]
    want = loader_workers(cpus)
    if workers < want:
        assert f"num_workers={want}" in live or f"to {want}" in live, live
        assert f"num_workers={want}" in report or f"to {want}" in report, report
    else:
        assert "make each batch cheaper" in live and "make each batch cheaper" in report


def test_workers_at_the_rules_cap_are_not_said_to_use_every_core():
    # 8 workers on 16 cores: the rule's cap (each worker holds a copy of the dataset), not every
    # core; both the live finding and the report said "already uses every CPU/core"
    info = {"type": "DataLoader", "num_workers": 8, "cpus": 16}
    live = " ".join(stall_advice(info, bursty=False))
    report = verdict_advice("input_bound", RunContext(device="cpu", loader=info))[0]
    for text in (live, report):
        assert "every core" not in text and "every CPU" not in text, text
        assert "at most 8" in text and "make each batch cheaper" in text
    full = {"type": "DataLoader", "num_workers": 2, "cpus": 2}
    assert "every core this process may use" in " ".join(stall_advice(full, bursty=False))
