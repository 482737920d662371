"""Signals stay the job's: real SIGINT/SIGTERM sent to a real training process at the window's
stop (and inside the window, and at the stop after its first step, which the default byte budget
saves on its own), with the dispositions jobs use: the default, SIG_IGN, a graceful stop
handler, ``signal(SIGTERM, lambda *_: sys.exit(143))``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import load_trace, profiler_steps

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    import torch
    from torch.profiler import profile
    from helpers import tiny_model, train_step
    from profcallbacks import Schedule, StepProfiler

    SIG = getattr(signal, {sig!r})
    calls = []
    if {disposition!r} == "exit":
        signal.signal(SIG, lambda *_: sys.exit(143))
    elif {disposition!r} == "ignore":
        signal.signal(SIG, signal.SIG_IGN)
    elif {disposition!r} == "graceful":
        signal.signal(SIG, lambda signum, frame: calls.append(signum))
    real_stop = profile.stop_trace
    stops = []

    def stop_with_a_signal(self):
        stops.append(self)  # the first: after the window's first step, saved on its own
        if ({when!r}, len(stops)) in (("cut", 1), ("stop", 2)):
            os.kill(os.getpid(), SIG)  # arrives in the middle of that stop
        return real_stop(self)

    profile.stop_trace = stop_with_a_signal
    model, opt = tiny_model()
    with StepProfiler({logdir!r}, schedule=Schedule(skip_first=2, warmup=0, active=3, repeat=1),
                      stall=None, slowdown=None, sync_audit=False, memory=None,
                      tensorboard_scalars=False) as prof:
        for step in range(12):
            train_step(model, opt)
            if {when!r} == "window" and step == 3:
                os.kill(os.getpid(), SIG)  # inside the window, between the job's own steps
            prof.step()
            if calls:
                break  # the graceful stop: finish the step, leave the loop
    print("finished", len(calls), torch.autograd.profiler._is_profiler_enabled, flush=True)
""")


def _run(tmp_path: Path, sig: str, disposition: str, when: str) -> tuple[int, str, str]:
    logdir = tmp_path / "run"
    script = SCRIPT.format(tests=str(Path(__file__).parent), sig=sig, disposition=disposition,
                           when=when, logdir=str(logdir))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _captures(tmp_path: Path) -> dict[str, list[int]]:
    out = {}
    for d in sorted((tmp_path / "run").glob("step*")):
        (trace,) = d.glob("*.pt.trace.json*")
        out[d.name] = profiler_steps(load_trace(trace)) if trace.suffix == ".gz" else []
    return out


def test_sigterm_with_an_exit_handler_at_the_stop_exits_143_with_the_capture(tmp_path):
    rc, out, err = _run(tmp_path, "SIGTERM", "exit", "stop")
    assert rc == 143, err[-2000:]  # the job's own handler ran; no segfault (139)
    assert _captures(tmp_path) == {"step000002-schedule": [2, 3, 4]}


def test_default_sigterm_at_the_stop_ends_the_process_after_publishing(tmp_path):
    rc, out, err = _run(tmp_path, "SIGTERM", "default", "stop")
    assert rc == -signal.SIGTERM, err[-2000:]  # the default disposition, as without profiling
    assert "finished" not in out
    assert _captures(tmp_path) == {"step000002-schedule": [2, 3, 4]}


def test_default_sigterm_inside_a_window_publishes_the_recorded_steps_as_partial(tmp_path):
    rc, out, err = _run(tmp_path, "SIGTERM", "default", "window")
    assert rc == -signal.SIGTERM, err[-2000:]
    assert "finished" not in out
    assert _captures(tmp_path) == {"step000002-schedule-partial": [2]}
    assert not list((tmp_path / "run").glob(".profcallbacks-staging/*"))


def test_sigterm_exit_handler_inside_a_window_publishes_partial(tmp_path):
    rc, out, err = _run(tmp_path, "SIGTERM", "exit", "window")
    assert rc == 143, err[-2000:]
    assert _captures(tmp_path) == {"step000002-schedule-partial": [2]}


def test_an_ignored_sigint_stays_ignored(tmp_path):
    rc, out, err = _run(tmp_path, "SIGINT", "ignore", "stop")
    assert rc == 0 and "KeyboardInterrupt" not in err, err[-2000:]
    assert out.split() == ["finished", "0", "False"]
    assert _captures(tmp_path) == {"step000002-schedule": [2, 3, 4]}


def test_a_graceful_sigint_handler_runs_exactly_once(tmp_path):
    rc, out, err = _run(tmp_path, "SIGINT", "graceful", "stop")
    assert rc == 0 and "KeyboardInterrupt" not in err, err[-2000:]
    assert out.split() == ["finished", "1", "False"]  # the job's handler saw the one signal
    assert _captures(tmp_path) == {"step000002-schedule": [2, 3, 4]}


@pytest.mark.parametrize("when", ["stop", "cut", "window"])
def test_default_sigint_raises_keyboard_interrupt_after_the_stop(tmp_path, when):
    rc, out, err = _run(tmp_path, "SIGINT", "default", when)
    assert rc == -signal.SIGINT and "KeyboardInterrupt" in err and "finished" not in out
    expected = ({"step000002-schedule": [2, 3, 4]} if when == "stop"
                else {"step000002-schedule-partial": [2]})
    assert _captures(tmp_path) == expected
    assert not list((tmp_path / "run").glob(".profcallbacks-staging/*"))


def test_sigterm_exit_handler_at_the_first_steps_stop_publishes_it_as_partial(tmp_path):
    rc, out, err = _run(tmp_path, "SIGTERM", "exit", "cut")
    assert rc == 143, err[-2000:]
    assert _captures(tmp_path) == {"step000002-schedule-partial": [2]}
    assert not list((tmp_path / "run").glob(".profcallbacks-staging/*"))
