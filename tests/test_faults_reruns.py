"""Notebook re-runs: after the real HF Trainer's train() raised in an interactive interpreter
(which keeps the exception), a new Trainer and callback on the same log directory start, the
abandoned profiler's log directory and torch profiler are released with one warning."""

from __future__ import annotations

import code
import gc
import importlib.util
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

from helpers import captured_steps, tiny_model, train_step  # noqa: E402
from profcallbacks import Schedule, StepProfiler  # noqa: E402
from profcallbacks.hf import ProfilerCallback  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "hf_example_reruns", Path(__file__).resolve().parents[1] / "examples" / "hf_example.py")
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class BreaksAtCall(example.TinyRegressor):
    """Raises in its ``fail_at``-th training forward (a bug hit in the middle of a window)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def forward(self, x, labels=None):
        self.calls += 1
        if self.training and self.calls == self.fail_at:
            raise RuntimeError("shape mismatch in the new loss")
        return super().forward(x, labels)


def _trainer(tmp_path, logdir, model):
    args = example.training_args(str(tmp_path / "out"), max_steps=8)
    callback = ProfilerCallback(logdir, schedule=Schedule(skip_first=2, warmup=0, active=4,
                                                          repeat=1), tensorboard_scalars=False)
    return transformers.Trainer(model=model, args=args, train_dataset=example.SyntheticRegression(256),
                                callbacks=[callback])


@pytest.fixture
def shell(monkeypatch):
    """A real interactive interpreter; what it sets on ``sys`` is undone after the test."""
    for name in ("last_exc", "last_value", "last_type", "last_traceback"):
        monkeypatch.delattr(sys, name, raising=False)
    return code.InteractiveInterpreter()


def test_a_new_trainer_after_train_raised_takes_the_logdir_over(tmp_path, caplog, shell):
    logdir = tmp_path / "prof"
    shell.locals.update(trainer=_trainer(tmp_path, logdir, BreaksAtCall(fail_at=5)))
    shell.runsource("trainer.train()")  # the cell raises; the shell keeps the exception
    kept = getattr(sys, "last_exc", None) or sys.last_value
    assert isinstance(kept, RuntimeError)
    assert torch.autograd.profiler._is_profiler_enabled  # left recording by the first run
    with caplog.at_level(logging.WARNING):
        shell.locals.update(trainer=_trainer(tmp_path, logdir, example.TinyRegressor()))
        shell.runsource("trainer.train()")  # the re-run of the fixed cell
    assert getattr(sys, "last_exc", None) is kept or sys.last_value is kept  # no new error
    warnings = [r.getMessage() for r in caplog.records if "never closed" in r.getMessage()]
    assert len(warnings) == 1 and "LogdirInUseError" not in caplog.text
    assert not torch.autograd.profiler._is_profiler_enabled
    steps = captured_steps(logdir)
    assert steps["step000002-schedule"] == [2, 3, 4, 5]  # the re-run's own capture
    assert [name for name in steps if name.endswith("-partial")]  # what the first one recorded


def test_a_profiler_collected_while_open_releases_the_logdir(tmp_path, caplog):
    model, opt = tiny_model()
    prof = StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False)
    prof.__enter__()  # entered by hand and never exited
    train_step(model, opt)
    prof.step()
    with caplog.at_level(logging.WARNING):
        del prof
        gc.collect()
    assert "never closed and is collected" in caplog.text
    with StepProfiler(tmp_path, schedule=None, tensorboard_scalars=False):
        pass  # the log directory is free again
