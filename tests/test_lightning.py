"""ProfilerCallback with the real Lightning Trainer (tiny model, synthetic data), checked from files."""

import csv
import importlib
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.profilers import PyTorchProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import captured_steps, load_trace, trace_files
from profcallbacks import Schedule
from profcallbacks.lightning import ProfilerCallback

HERE = Path(__file__).parent


class Tiny(pl.LightningModule):
    """Two linear layers; optional sleeps stand in for slow validation, epoch ends, checkpoints."""

    def __init__(self, pause_s: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.pause_s = pause_s

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        with torch.profiler.record_function("test_validation_step"):
            time.sleep(self.pause_s)
            return self.net(batch[0]).pow(2).mean()

    def on_train_epoch_start(self):
        time.sleep(self.pause_s)

    def on_train_epoch_end(self):
        time.sleep(self.pause_s)

    def on_save_checkpoint(self, checkpoint):
        time.sleep(self.pause_s)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(batches: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(batches * 4, 16)), batch_size=4)


def fit(root: Path, callback: ProfilerCallback, *, batches: int = 60, model: Tiny | None = None,
        ckpt_path: str | None = None, val_batches: int = 0, **trainer_kwargs) -> pl.Trainer:
    trainer_kwargs.setdefault("enable_checkpointing", False)
    trainer = pl.Trainer(default_root_dir=root, callbacks=[callback], enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=val_batches,
                         num_sanity_val_steps=min(val_batches, 1), **trainer_kwargs)
    trainer.fit(model or Tiny(), loader(batches), loader(4) if val_batches else None,
                ckpt_path=ckpt_path)
    return trainer


def spans(trace, prefix):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(prefix)]


def inside(event, span):
    return span["ts"] <= event["ts"] and event["ts"] + event["dur"] <= span["ts"] + span["dur"]


def test_missing_lightning_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "profcallbacks.lightning")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'profcallbacks\[lightning\]'"):
        importlib.import_module("profcallbacks.lightning")


@pytest.mark.parametrize("accumulate", [1, 3])
def test_each_step_range_is_one_optimizer_step_and_its_micro_batches(tmp_path, accumulate):
    callback = ProfilerCallback(schedule=Schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2))
    trainer = fit(tmp_path, callback, batches=12 * accumulate, max_steps=10,
                  accumulate_grad_batches=accumulate)
    logdir = Path(trainer.log_dir)
    assert captured_steps(logdir) == {"step000004-schedule": [4, 5], "step000008-schedule": [8, 9]}
    assert sorted(p.name for p in callback.captures) == ["step000004-schedule", "step000008-schedule"]
    trace = load_trace(trace_files(logdir / "step000004-schedule")[0])
    steps = spans(trace, "ProfilerStep#")
    for name, per_step in [("Optimizer.step#", 1), ("enumerate(DataLoader)#", accumulate),
                           ("aten::linear", 2 * accumulate),  # forward: two layers a micro-batch
                           ("autograd::engine::evaluate_function: AddmmBackward0", 2 * accumulate)]:
        events = spans(trace, name)
        assert len(events) == per_step * len(steps), name
        for event in events:  # each lies in exactly one step range
            assert sum(inside(event, s) for s in steps) == 1, (name, event, steps)


class ManualEveryOther(Tiny):
    """Manual optimization that steps the optimizer on even batches only."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.manual_backward(loss)
        if batch_idx % 2 == 0:
            optimizer = self.optimizers()
            optimizer.step()
            optimizer.zero_grad()
        return loss


def test_manual_optimization_counts_only_batches_that_step(tmp_path):
    callback = ProfilerCallback(schedule=Schedule(skip_first=2, warmup=1, active=2),
                                log_every_n_steps=1, tensorboard_scalars=False)
    trainer = fit(tmp_path, callback, batches=20, max_epochs=1, model=ManualEveryOther())
    logdir = Path(trainer.log_dir)
    rows = [json.loads(line) for line in (logdir / "profcallbacks/rank0.steps.jsonl").open()]
    assert [r["first_step"] for r in rows] == list(range(10)) == list(range(trainer.global_step))
    assert captured_steps(logdir) == {"step000003-schedule": [3, 4]}


def test_validation_epoch_ends_and_checkpoints_belong_to_no_step(tmp_path):
    callback = ProfilerCallback(schedule=Schedule(skip_first=3, warmup=1, active=4),
                                log_every_n_steps=1, tensorboard_scalars=False)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    trainer = pl.Trainer(default_root_dir=tmp_path, callbacks=[callback, checkpoint], max_steps=12,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=2,
                         num_sanity_val_steps=1, val_check_interval=2)
    trainer.fit(Tiny(pause_s=0.15), loader(4), loader(2))  # 3 epochs of 4 steps
    logdir = Path(trainer.log_dir)
    trace = load_trace(trace_files(logdir / "step000004-schedule")[0])
    steps, validation = spans(trace, "ProfilerStep#"), spans(trace, "test_validation_step")
    assert len(steps) == 4 and len(validation) >= 2  # validation ran inside the window
    assert not any(inside(v, s) or inside(s, v) or s["ts"] <= v["ts"] <= s["ts"] + s["dur"]
                   for v in validation for s in steps)
    rows = [json.loads(line) for line in (logdir / "profcallbacks/rank0.steps.jsonl").open()]
    assert [r["first_step"] for r in rows] == list(range(12))
    assert max(r["step_time_ms_max"] for r in rows) < 100  # each pause slept 150 ms


def test_validation_in_windows_of_its_own(tmp_path):
    callback = ProfilerCallback(schedule=Schedule(skip_first=1, warmup=0, active=2),
                                capture_validation=True, max_captures=3, sync_audit=False)
    trainer = fit(tmp_path, callback, batches=8, max_steps=8, val_batches=2, val_check_interval=4)
    logdir = Path(trainer.log_dir)
    # validation after steps 3 and 7 (the next training steps are 4 and 8); the sanity check
    # before training is not captured
    assert captured_steps(logdir) == {"step000001-schedule": [1, 2],
                                      "step000004-validation": [4],
                                      "step000008-validation": [8]}
    trace = load_trace(trace_files(logdir / "step000004-validation")[0])
    (span,) = spans(trace, "ProfilerStep#")
    validation = spans(trace, "test_validation_step")
    assert len(validation) == 2 and all(inside(v, span) for v in validation)
    assert not spans(trace, "Optimizer.step#")  # no training in a validation capture


def test_scalars_go_through_the_trainers_loggers_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    loggers = [TensorBoardLogger(tmp_path), CSVLogger(tmp_path)]
    callback = ProfilerCallback(schedule=None, log_every_n_steps=5)
    trainer = fit(tmp_path, callback, max_steps=10, logger=loggers)
    assert Path(trainer.log_dir) == Path(loggers[0].log_dir)  # the default logdir
    events = EventAccumulator(str(trainer.log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("profcallbacks/step_time_ms")] == [4, 9]  # not twice
    with open(Path(loggers[1].log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("profcallbacks/step_time_ms")]
    assert [int(r["step"]) for r in rows] == [4, 9]


def test_lightning_profiler_as_well_warns_and_never_crashes(tmp_path, caplog):
    other = PyTorchProfiler(dirpath=tmp_path / "lightning_profiler", filename="p",
                            schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))
    callback = ProfilerCallback(schedule=Schedule(skip_first=2, warmup=1, active=3))
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        trainer = fit(tmp_path, callback, max_steps=10, profiler=other)
        callback.capture(2)
    assert "Trainer(profiler=PyTorchProfiler) is set as well" in caplog.text
    assert "capture() ignored: Trainer(profiler=PyTorchProfiler) owns torch.profiler" in caplog.text
    assert captured_steps(Path(trainer.log_dir)) == {} and trainer.global_step == 10


def test_resume_counts_steps_from_global_step_and_keeps_capture_history(tmp_path):
    def callback():
        return ProfilerCallback(schedule=Schedule(skip_first=1, wait=2, warmup=1, active=1,
                                                  repeat=0), max_captures=3)
    first = callback()
    trainer = fit(tmp_path, first, batches=8, max_steps=10, enable_checkpointing=True)
    assert [p.name for p in first.captures] == ["step000004-schedule", "step000008-schedule"]
    (ckpt,) = Path(trainer.log_dir, "checkpoints").glob("*.ckpt")
    second = callback()
    trainer = fit(tmp_path, second, batches=8, max_steps=20, ckpt_path=str(ckpt))
    # global steps 12 and 16 are scheduled; max_captures=3 counts the two taken before the resume
    assert captured_steps(Path(trainer.log_dir)) == {"step000012-schedule": [12]}
    assert second.state_dict()["captures_started"] == 3
    # captures lists earlier ones exported by the time the checkpoint was written, then this fit's
    assert [p.name for p in second.captures][-1] == "step000012-schedule"


def test_lightning_cli_yaml_example_parses(tmp_path):
    pytest.importorskip("jsonargparse")
    sys.path.insert(0, str(HERE.parent / "examples"))
    try:
        example = importlib.import_module("lightning_example")
    finally:
        sys.path.pop(0)
    cli = example.main(["--config", str(HERE.parent / "examples/lightning_cli.yaml"),
                        "--trainer.default_root_dir", str(tmp_path)], run=False)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, ProfilerCallback)]
    assert callback.config.schedule == Schedule(skip_first=10, wait=20, warmup=1, active=3, repeat=2)
    assert callback.config.log_every_n_steps == 10 and callback.logdir is None


@pytest.mark.slow
def test_ddp_two_processes_write_both_ranks_into_each_capture(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "lightning_ddp_script.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in (0, 1)]
    logdir = Path(results[0]["log_dir"])
    assert results[1]["log_dir"] == str(logdir)
    captures = sorted(p for p in logdir.iterdir() if p.name.startswith("step"))
    assert [p.name for p in captures] == ["step000005-schedule", "step000010-schedule"]
    for capture in captures:
        files = trace_files(capture)
        assert [f.name.split("_")[0] for f in files] == ["rank0", "rank1"]
        assert [load_trace(f)["distributedInfo"]["rank"] for f in files] == [0, 1]
    for result in results:
        assert result["findings"] and {f["rank"] for f in result["findings"]} == {result["rank"]}
        assert (logdir / f"profcallbacks/rank{result['rank']}.steps.jsonl").exists()
