"""The Hugging Face Trainer callback, driven by the real Trainer and checked from the files it writes."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

from helpers import capture_dirs, captured_steps, load_trace, trace_files  # noqa: E402
from profcallbacks import Schedule  # noqa: E402
from profcallbacks.hf import ProfilerCallback  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hf_example.py"
_spec = importlib.util.spec_from_file_location("hf_example", EXAMPLE)
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class LogRecorder(transformers.TrainerCallback):
    """Placed after ProfilerCallback: sees the logs the Trainer hands to its integrations."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


class StepClock(transformers.TrainerCallback):
    """Placed after ProfilerCallback: when each optimizer step ended, and each evaluation, on
    the run's own clock (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.step_ends: list[float] = []
        self.boundaries: list[float] = []  # where a step may begin: an epoch, a step, an evaluation
        self.evaluations: list[tuple[float, float]] = []  # (began, ended)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.boundaries.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_ends.append(now)
        self.boundaries.append(now)

    def on_evaluate(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.evaluations.append((self.step_ends[-1], now))
        self.boundaries.append(now)

    def own_times_ms(self) -> list[float]:
        """Each step's time without what came before it (the latest boundary before its end)."""
        return [(end - max(b for b in self.boundaries if b < end)) * 1e3 for end in self.step_ends]


def train(tmp_path, *, max_steps, callback, grad_accum=1, eval_steps=0, model=None,
          report_to="none", extra_callbacks=()):
    args = example.training_args(str(tmp_path / "out"), max_steps=max_steps, grad_accum=grad_accum,
                                 eval_steps=eval_steps, report_to=report_to)
    trainer = transformers.Trainer(
        model=model or example.TinyRegressor(), args=args,
        train_dataset=example.SyntheticRegression(256),
        eval_dataset=example.SyntheticRegression(24, seed=1),
        callbacks=[callback, *extra_callbacks])
    trainer.train()
    return trainer


def events(trace, prefix):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(prefix)]


def ranges_holding(ranges, event):
    return [r for r in ranges if r["ts"] <= event["ts"] and
            event["ts"] + event["dur"] <= r["ts"] + r["dur"]]


@pytest.mark.parametrize("grad_accum", [1, 4])
def test_each_captured_step_is_one_optimizer_step_with_its_forwards(tmp_path, grad_accum):
    callback = ProfilerCallback(tmp_path / "prof", schedule=Schedule(skip_first=2, warmup=1, active=2),
                                tensorboard_scalars=False)
    train(tmp_path, max_steps=7, callback=callback, grad_accum=grad_accum)
    assert captured_steps(tmp_path / "prof") == {"step000003-schedule": [3, 4]}
    trace = load_trace(trace_files(tmp_path / "prof" / "step000003-schedule")[0])
    ranges = events(trace, "ProfilerStep#")
    forwards = events(trace, "tiny.forward.train")
    optimizer_steps = events(trace, "Optimizer.step#")
    assert len(forwards) == 2 * grad_accum and len(optimizer_steps) == 2
    for r in ranges:
        assert len([o for o in optimizer_steps if ranges_holding([r], o)]) == 1
        assert len([f for f in forwards if ranges_holding([r], f)]) == grad_accum
    fetches = events(trace, "enumerate(DataLoader)#")
    assert len(fetches) == 2 * grad_accum  # the Trainer fetches a step's micro-batches in it
    assert all(len(ranges_holding(ranges, f)) == 1 for f in fetches)


def test_evaluation_lies_outside_steps_in_traces_and_times(tmp_path):
    callback = ProfilerCallback(tmp_path / "prof", schedule=Schedule(skip_first=1, warmup=1, active=4),
                                tensorboard_scalars=False, log_every_n_steps=1)
    # evaluation after every 2nd step: 3 batches of 0.15 s each; recording starts at the end of step 1
    clock = StepClock()
    train(tmp_path, max_steps=8, callback=callback, eval_steps=2,
          model=example.TinyRegressor(eval_delay_s=0.15), extra_callbacks=[clock])
    assert captured_steps(tmp_path / "prof") == {"step000002-schedule": [2, 3, 4, 5]}
    trace = load_trace(trace_files(tmp_path / "prof" / "step000002-schedule")[0])
    ranges = events(trace, "ProfilerStep#")
    evals = events(trace, "tiny.forward.eval")
    assert len(evals) == 6  # the evaluations after steps 1 and 3 ran while recording...
    assert all(ranges_holding(ranges, e) == [] for e in evals)  # ...and belongs to no step
    assert all(len(ranges_holding(ranges, f)) == 1 for f in events(trace, "tiny.forward.train"))
    rows = [json.loads(line) for line in
            (tmp_path / "prof" / "profcallbacks" / "rank0.steps.jsonl").open()]
    assert [r["first_step"] for r in rows] == list(range(8))
    # no step time holds an evaluation: each is its step's own time (measured here, at any
    # machine speed), far from that plus an evaluation (>= 450 ms of sleeps, more when busy)
    evaluation_ms = min(ended - began for began, ended in clock.evaluations) * 1e3
    assert len(clock.evaluations) == 4 and evaluation_ms >= 450
    for row, own_ms in zip(rows, clock.own_times_ms(), strict=True):
        assert row["step_time_ms"] < own_ms + evaluation_ms / 2, (row, own_ms, evaluation_ms)


def test_evaluation_in_windows_of_its_own(tmp_path):
    callback = ProfilerCallback(tmp_path / "prof", schedule=None, capture_validation=True,
                                tensorboard_scalars=False, max_captures=2, sync_audit=False)
    train(tmp_path, max_steps=6, callback=callback, eval_steps=2)
    # evaluations after steps 1, 3 and 5 (global steps 2, 4, 6); max_captures=2 keeps two
    assert captured_steps(tmp_path / "prof") == {"step000002-validation": [2],
                                                  "step000004-validation": [4]}
    trace = load_trace(trace_files(tmp_path / "prof" / "step000002-validation")[0])
    (span,) = events(trace, "ProfilerStep#")
    evals = events(trace, "tiny.forward.eval")
    assert evals and all(ranges_holding([span], e) == [span] for e in evals)
    assert events(trace, "tiny.forward.train") == []


def test_max_steps_inside_window_exports_partial(tmp_path):
    callback = ProfilerCallback(tmp_path / "prof", schedule=Schedule(skip_first=2, warmup=1, active=10),
                                tensorboard_scalars=False)
    train(tmp_path, max_steps=6, callback=callback, grad_accum=2)
    assert captured_steps(tmp_path / "prof") == {"step000003-schedule-partial": [3, 4, 5]}
    trace = load_trace(trace_files(tmp_path / "prof" / "step000003-schedule-partial")[0])
    assert trace["profcallbacks"]["partial"] is True
    assert callback.captures == [tmp_path / "prof" / "step000003-schedule-partial"]


class FailingRegressor(example.TinyRegressor):
    def __init__(self, fail_at_forward: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_at_forward = fail_at_forward

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == self.fail_at_forward:
            raise RuntimeError("boom")
        return super().forward(x, labels)


def test_training_that_raises_stops_the_profiler_and_leaves_whole_files(tmp_path):
    callback = ProfilerCallback(tmp_path / "prof", schedule=Schedule(skip_first=2, warmup=1, active=5),
                                tensorboard_scalars=False)
    with pytest.raises(RuntimeError, match="boom"):  # fails in step 5, inside the window
        train(tmp_path, max_steps=10, callback=callback, model=FailingRegressor(fail_at_forward=6))
    gc.collect()
    assert torch.autograd.profiler._is_profiler_enabled  # no hook ran: still recording
    del callback  # when the callback goes (or the process exits), the window is closed
    gc.collect()
    assert not torch.autograd.profiler._is_profiler_enabled
    assert captured_steps(tmp_path / "prof") == {"step000003-schedule-partial": [3, 4]}
    staging = tmp_path / "prof" / ".profcallbacks-staging"
    assert not staging.exists() or not any(staging.rglob("*.*"))


def test_default_logdir_is_the_tensorboard_run_and_metrics_reach_the_logs(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recorder = LogRecorder()
    callback = ProfilerCallback(schedule=Schedule(skip_first=1, warmup=0, active=1), log_every_n_steps=2)
    trainer = train(tmp_path, max_steps=4, callback=callback, report_to="tensorboard",
                    extra_callbacks=[recorder])
    logdir = callback.session.logdir
    assert logdir.parent == tmp_path / "out" / "runs"
    assert [d.name for d in capture_dirs(logdir)] == ["step000001-schedule"]
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags and "profcallbacks/step_time_ms" in tags  # one run, both sources
    with_ours = [log for log in recorder.logs if "profcallbacks/step_time_ms" in log]
    assert len(with_ours) == 2 and all(log["profcallbacks/step_time_ms"] > 0 for log in with_ours)
    assert sum("profcallbacks/step_time_ms" in h for h in trainer.state.log_history) == 2


def test_a_slow_integration_start_keeps_everything_in_hfs_own_tensorboard_run(tmp_path, monkeypatch):
    """With report_to=["tensorboard", "wandb"] the W&B integration starts between HF's TensorBoard
    writer and this callback; a slow ``wandb.init`` (4 s here, 9 s seen) must not split the run."""
    wandb = pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                        "WANDB_DISABLE_GIT": "true"}.items():
        monkeypatch.setenv(name, value)
    real_init = wandb.init

    def slow_init(*args, **kwargs):
        import time

        time.sleep(4.0)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", slow_init)
    wandb.teardown()
    callback = ProfilerCallback(schedule=Schedule(skip_first=1, warmup=0, active=1), log_every_n_steps=2)
    try:
        train(tmp_path, max_steps=4, callback=callback, report_to=["tensorboard", "wandb"])
    finally:
        wandb.finish()
        wandb.teardown()
    runs = sorted((tmp_path / "out" / "runs").iterdir())
    assert runs == [callback.session.logdir]  # one run directory: HF's
    acc = EventAccumulator(str(runs[0]))
    acc.Reload()
    assert {"train/loss", "profcallbacks/step_time_ms"} <= set(acc.Tags()["scalars"])
    assert [d.name for d in capture_dirs(runs[0])] == ["step000001-schedule"]


def test_capture_requested_before_training(tmp_path):
    callback = ProfilerCallback(tmp_path / "prof", schedule=None, tensorboard_scalars=False)
    callback.capture(steps=2)
    with pytest.raises(ValueError, match="steps must be an int"):
        callback.capture(steps=0)
    train(tmp_path, max_steps=5, callback=callback)
    assert captured_steps(tmp_path / "prof") == {"step000001-manual": [1, 2]}


def test_session_without_finding_logs_still_records_findings(tmp_path, caplog):
    from profcallbacks import Finding, ProfilerConfig, ProfilingSession

    session = ProfilingSession(ProfilerConfig(schedule=None, tensorboard_scalars=False), tmp_path,
                               log_findings=False)
    session.open()
    with caplog.at_level("INFO", logger="profcallbacks"):
        session.emit(Finding("dataloader_stall", step=0, rank=1, severity="warning", message="x"))
    session.close()
    assert caplog.records == [] and len(session.findings) == 1
    assert (tmp_path / "profcallbacks" / "rank0.findings.jsonl").read_text().count("\n") == 1


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "profcallbacks.hf")
    with pytest.raises(ImportError, match=r"pip install 'profcallbacks\[hf\]'"):
        importlib.import_module("profcallbacks.hf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_torchrun_two_ranks_write_one_file_each(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TENSORBOARD_LOGGING_DIR", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               f"--master_port={free_port()}", str(EXAMPLE), "--output-dir", str(out),
               "--max-steps", "6", "--eval-steps", "3", "--skip-first", "2", "--active", "2",
               "--summary", str(tmp_path / "summary")]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both workers
            raise
    result = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    summaries = [json.loads((tmp_path / f"summary.rank{r}.json").read_text()) for r in (0, 1)]
    assert summaries[0]["logdir"] == summaries[1]["logdir"]  # rank 0's TensorBoard run
    logdir = Path(summaries[0]["logdir"])
    assert logdir.parent == out / "runs"
    (capture,) = capture_dirs(logdir)
    assert capture.name == "step000003-schedule"
    files = trace_files(capture)
    assert [f.name.split("_")[0] for f in files] == ["rank0", "rank1"]
    for rank, path in enumerate(files):
        trace = load_trace(path)
        assert trace["distributedInfo"] == {"backend": "gloo", "rank": rank, "world_size": 2}
        assert [int(e["name"].split("#")[1]) for e in events(trace, "ProfilerStep#")] == [3, 4]
    assert (result.stdout + result.stderr).count("captures in") == 1  # world process zero only
