"""The Lightning front end's hot path: its hooks bypass the fetch timer."""

from __future__ import annotations

import time

import pytest


def test_lightning_hooks_bypass_the_fetch_timer():
    """Lightning calls profiler.profile() around every hook: that is the wrapped profiler's own."""
    pytest.importorskip("lightning")
    from lightning.pytorch.profilers import SimpleProfiler

    from profcallbacks.lightning_fetch import FETCH_ACTION, FetchTimer

    inner = SimpleProfiler()
    waits: list[float] = []
    timer = FetchTimer(inner, waits.append)
    assert timer.profile == inner.profile  # no frame of ours per hook
    with timer.profile("[Callback]x.on_train_batch_end"):
        pass
    timer.start(f"[_TrainingEpochLoop].{FETCH_ACTION}")
    time.sleep(0.01)
    timer.stop(f"[_TrainingEpochLoop].{FETCH_ACTION}")
    assert len(waits) == 1 and waits[0] >= 0.009
    assert "on_train_batch_end" in inner.summary()  # the wrapped profiler still sees every hook
