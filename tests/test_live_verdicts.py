"""Live verdicts on real CPU runs: capture_verdict per exported capture, slowdown_diagnosis."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median

import pytest
import torch

from profcallbacks import Schedule, SlowdownConfig, StepProfiler
from profcallbacks.findings import (
    CAPTURE_VERDICT,
    SLOWDOWN_DIAGNOSIS,
    STEP_BASELINE_RESET,
    STEP_SLOWDOWN,
    STEP_SPEED_RECOVERED,
    Finding,
)
from profcallbacks.report import build_report, locate_run, render_text
from profcallbacks.report.analyse.growth import MAX_WORK_FACTOR, WAIT_SHARE

pytestmark = pytest.mark.usefixtures("one_thread")


def batches(steps: int, delay_s: float, slower_from: int | None = None,
            slower_delay_s: float = 0.0, width: int = 256) -> Iterator[torch.Tensor]:
    """``steps`` batches, each ``delay_s`` late (``slower_delay_s`` from step ``slower_from``):
    a plain generator, not a DataLoader, as in nanoGPT's ``iter(get_batch, None)``."""
    x = torch.randn(64, width)
    for i in range(steps):
        slow = slower_from is not None and i >= slower_from
        delay = slower_delay_s if slow else delay_s
        if delay:  # sleep(0) still yields the CPU, for milliseconds on a loaded machine
            time.sleep(delay)
        yield x


def run(logdir: Path, loader: Iterator[torch.Tensor], *,
        extra_work: Callable[[int], float] | None = None,
        made: list[StepProfiler] | None = None, width: int = 256, **options) -> StepProfiler:
    """Trains on ``loader``; ``extra_work(step)``: seconds of extra matrix multiplications the
    step does after its own work (0 for none); the profiler is appended to ``made``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    w = torch.randn(width, width)
    options.setdefault("stall", None)
    prof = StepProfiler(logdir, tensorboard_scalars=False, watch_capture_file=False,
                        sync_audit=False, **options)
    if made is not None:
        made.append(prof)
    with prof:
        for step, x in enumerate(prof.wrap(loader)):
            for _ in range(3):
                loss = model(x).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            extra_s = extra_work(step) if extra_work is not None else 0.0
            if extra_s > 0:  # the step gets slower by extra matrix multiplications
                until = time.perf_counter() + extra_s
                while time.perf_counter() < until:
                    for _ in range(8):
                        x = torch.mm(x, w) / 16.0
            prof.step()
    return prof


def verdicts(prof: StepProfiler) -> list[dict]:
    return [f.details for f in prof.findings if f.kind == CAPTURE_VERDICT]


SCHEDULED = {"schedule": Schedule(skip_first=4, warmup=1, active=3), "slowdown": None}


def test_slow_loader_is_input_bound_live_and_in_the_report(tmp_path):
    fetched: list[int] = []
    received: list[tuple[str, int]] = []

    def loader() -> Iterator[torch.Tensor]:
        """Batches 0.1 s late: at least 24, and 3 more once the verdict came (however long the
        export takes on this machine; only a time guard against a hang)."""
        deadline = time.monotonic() + GUARD_S
        for x in batches(1_000_000, 0.1):
            came = [n for kind, n in received if kind == CAPTURE_VERDICT]
            if len(fetched) >= 24 and came and len(fetched) >= came[0] + 3:
                return
            assert time.monotonic() < deadline, f"no capture_verdict in {GUARD_S:.0f} s"
            fetched.append(1)
            yield x

    prof = run(tmp_path, loader(), **SCHEDULED,
               on_finding=lambda f: received.append((f.kind, len(fetched))))
    [live] = verdicts(prof)
    # emitted while training goes on (batches still to come), not only at close
    assert [n for kind, n in received if kind == CAPTURE_VERDICT][0] < len(fetched)
    assert live["kind"] == "input_bound" and live["capture"] == "step000005-schedule"
    assert live["share"] > 0.4 and live["evidence"] and live["advice"]
    report = build_report(locate_run(tmp_path))
    assert report["verdict"]["kind"] == "input_bound"
    # the wrap marked its fetches in the trace: traced breakdown and step timing agree
    assert report["breakdown"]["data_wait_share"] > 0.4
    finding = next(f for f in report["findings"] if f["kind"] == CAPTURE_VERDICT)
    assert finding["details"]["kind"] == "input_bound"  # reached findings.jsonl


def test_fast_loader_is_cpu_compute_bound(tmp_path):
    prof = run(tmp_path, batches(12, 0.0, width=1024), width=1024, **SCHEDULED)
    [live] = verdicts(prof)
    assert live["kind"] == "cpu_compute_bound", live
    assert build_report(locate_run(tmp_path))["verdict"]["kind"] == "cpu_compute_bound"


def test_wrap_marks_fetches_only_inside_windows(tmp_path):
    prof = run(tmp_path, batches(12, 0.001), **SCHEDULED)
    report = build_report(locate_run(tmp_path))
    [capture] = report["captures"]
    assert capture["steps"] == [5, 6, 7]
    host_steps = capture["files"][0]["host_steps"]
    assert all(s["data_wait_ms"] >= 0.9 for s in host_steps)  # one marked 1 ms fetch per step
    assert prof.session.tracing is False


DETECT = SlowdownConfig(threshold=3.0, spike_cap=6.0, warmup_steps=3, baseline_steps=5,
                        baseline_block_s=0.01, baseline_blocks=1, min_steps=2, min_duration_s=0.01,
                        capture_cooldown_steps=0)
"""Alerts on 2 steps 3x slower: on a busy machine its own neighbours trip it too, and each alert
captures, so the change a test makes is captured whatever the machine did before."""
GUARD_S = 300.0
"""Only a guard against a hang: every wait below ends on what the run shows, not on a count."""
SLOW_FACTOR = 8.0
"""A slow step takes this many times the step time measured just before the change: well past
``DETECT.threshold`` (3x) even if the machine's own speed wanders 2x meanwhile."""


def follow(switch: dict) -> Callable[[Finding], None]:
    """``on_finding`` that keeps in ``switch`` what :func:`after_baseline` waits on:
    ``"baseline"`` once the baseline capture's verdict came back (its profile is then in the
    export helper's history, which a slowdown capture is compared with), and ``"alerted"``
    while the detector is in a slowdown it alerted (the machine's, before the change)."""
    def seen(finding: Finding) -> None:
        if finding.kind == CAPTURE_VERDICT and finding.details["capture"].endswith("-baseline"):
            switch["baseline"] = True
        elif finding.kind == STEP_SLOWDOWN:
            switch["alerted"] = True
            switch.setdefault("alerts", []).append(finding.step)
        elif finding.kind in (STEP_SPEED_RECOVERED, STEP_BASELINE_RESET):
            switch["alerted"] = False
    return seen


def slowdown_capture(tmp_path: Path, switch: dict) -> str | None:
    """The first published slowdown capture that began after the change, if any."""
    first = switch.get("step")
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith("-slowdown"))
    return next((n for n in names if first is not None and int(n[4:10]) > first), None)


def after_baseline(tmp_path: Path, switch: dict, *, delay_s: float,
                   slower_delay: Callable[[float], float] | None = None,
                   width: int = 256) -> Iterator[torch.Tensor]:
    """Batches ``delay_s`` late until the baseline verdict came back and no alerted slowdown
    goes on (``switch`` as :func:`follow` keeps it), then batches ``slower_delay(base_s)``
    late until a slowdown capture of the steps after the change is published.

    ``switch["step"]`` is the first slow step, ``switch["base_s"]`` the median step time of
    the 9 steps before it, measured here: the run's own speed then, whatever the machine's load.
    """
    x = torch.randn(64, width)
    ends: list[float] = []
    step, deadline = 0, time.monotonic() + GUARD_S
    while switch.get("step") is None:
        assert time.monotonic() < deadline, (f"no baseline verdict, or a slowdown never over, "
                                             f"in {GUARD_S:.0f} s ({step} steps): {switch}")
        ends.append(time.perf_counter())
        if switch.get("baseline") and not switch.get("alerted") and len(ends) > 10:
            switch["base_s"] = median(b - a for a, b in zip(ends[-10:], ends[-9:], strict=False))
            switch["step"] = step
        if delay_s:  # sleep(0) yields the CPU: behind busy neighbours, for their whole turn
            time.sleep(delay_s)
        step += 1
        yield x
    slow_s = slower_delay(switch["base_s"]) if slower_delay is not None else delay_s
    while slowdown_capture(tmp_path, switch) is None:
        assert time.monotonic() < deadline, f"no slowdown capture in {GUARD_S:.0f} s: {switch}"
        if slow_s:
            time.sleep(slow_s)
        yield x


def slowdown_run(tmp_path: Path, *, extra_mm: bool = False,
                 slower_delay: Callable[[float], float] | None = None,
                 ) -> tuple[StepProfiler, dict]:
    switch: dict = {}
    loader = after_baseline(tmp_path, switch, delay_s=0.002, slower_delay=slower_delay)

    def extra_work(step: int) -> float:  # sized on the run's own speed, not on this machine's
        first = switch.get("step")
        return SLOW_FACTOR * switch["base_s"] if first is not None and step >= first else 0.0

    prof = run(tmp_path, loader, extra_work=extra_work if extra_mm else None, schedule=None,
               slowdown=DETECT, capture_steps=3, max_captures=100, on_finding=follow(switch))
    captures = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step"))
    assert captures[0].endswith("-baseline"), captures  # taken automatically after warm-up
    after = slowdown_capture(tmp_path, switch)
    assert after is not None, (captures, prof.findings)
    # the machine's own slowdowns before the change may have been diagnosed too: this is the
    # diagnosis of the capture of the steps after it
    [diagnosis] = [f for f in prof.findings
                   if f.kind == SLOWDOWN_DIAGNOSIS and f.details["after"] == after]
    assert diagnosis.severity == "warning"
    assert diagnosis.details["before"] == captures[0]
    assert diagnosis.details["before_verdict"]["kind"] and diagnosis.details["after_verdict"]["kind"]
    return prof, diagnosis.details


def test_extra_matmuls_diagnosed_as_matmul_growth(tmp_path):
    _, details = slowdown_run(tmp_path, extra_mm=True)
    first = details["changes"][0]
    assert first["what"] == "aten::mm", details["changes"][:3]
    assert first["after_ms"] > first["before_ms"] and first["delta_ms"] > 0
    # the code changed, not the machine: the growth sits in the new matmuls, the CPU work grew
    # (beside busy neighbours most of the growth can be waiting for a core, in proportion)
    assert details["growth"]["pattern"] == "concentrated", details["growth"]
    assert (details["growth"]["work_factor"] or 0) > MAX_WORK_FACTOR, details["growth"]
    assert "aten::mm" in details["growth"]["concentrated_in"]


MAX_COTENANTS = 64


def _recent_step_s(clocks: deque[tuple[float, float]]) -> float:
    """The median wall time of the steps ``clocks`` (wall, CPU) holds."""
    walls = [b[0] - a[0] for a, b in zip(clocks, list(clocks)[1:], strict=False)]
    return median(walls) if walls else 0.0


def cotenants(count: int, cpu: int) -> list[subprocess.Popen]:
    """``count`` processes spinning on CPU ``cpu``: a noisy neighbour on the training's core."""
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_cotenant_slowing_every_op_is_diagnosed_as_the_machine(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    switch: dict = {}
    neighbours: list[subprocess.Popen] = []
    prof_box: list[StepProfiler] = []

    def loader() -> Iterator[torch.Tensor]:
        # batches ready at once (not slept for: contention stretches work, a sleep it delays)
        clocks: deque[tuple[float, float]] = deque(maxlen=10)  # (wall, this thread's CPU) per step
        spawned, freed = 0, set()
        for x in after_baseline(tmp_path, switch, delay_s=0.0, width=1024):
            clocks.append((time.perf_counter(), time.thread_time()))
            helper = prof_box[0].session.export_helper_pid if prof_box else None
            if helper is not None and helper not in freed:  # spawned on the trainer's core:
                with contextlib.suppress(ProcessLookupError):  # it gets the other ones back,
                    os.sched_setaffinity(helper, affinity)  # or the neighbours starve it there
                freed.add(helper)
            first = switch.get("step")
            if first is not None and len(neighbours) < MAX_COTENANTS and (
                    not neighbours or (spawned >= 20 and max(switch.get("alerts", [-1])) < first
                                       and _recent_step_s(clocks) < 3 * switch["base_s"])):
                # the trainer's share of its core now, however many share it already: enough
                # neighbours at once to cut it 5x (4 on a core of its own); again if 20 steps
                # go by without an alert while the steps are not yet 3x slower (a gradual
                # slowdown would become the baseline); never more once they are, waiting for
                # the alert instead: a step slowed 60x is a few of the scheduler's turns, each
                # landing on whichever operator runs (one run read 450x for aten::mul, 41x for
                # aten::mm, and called it concentrated)
                (wall0, cpu0), (wall1, cpu1) = clocks[0], clocks[-1]
                share = min(max((cpu1 - cpu0) / (wall1 - wall0), 0.02), 1.0)
                count = min(math.ceil(4 / share), MAX_COTENANTS - len(neighbours))
                neighbours.extend(cotenants(count, cpu))
                spawned = 0
            spawned += 1
            yield x

    os.sched_setaffinity(0, {cpu})
    try:
        # steps of tens of ms, each several of the scheduler's time slices
        prof = run(tmp_path, loader(), schedule=None, slowdown=DETECT, capture_steps=6, width=1024,
                   max_captures=100, on_finding=follow(switch), made=prof_box)
    finally:
        for proc in neighbours:
            proc.kill()
            proc.wait()
        os.sched_setaffinity(0, affinity)
    assert neighbours, "the baseline capture never came"
    after = slowdown_capture(tmp_path, switch)
    [diagnosis] = [f for f in prof.findings
                   if f.kind == SLOWDOWN_DIAGNOSIS and f.details["after"] == after]
    growth = diagnosis.details["growth"]
    # the process's counters decide, not the step's shape: with five spinning neighbours on its
    # core, one operator (aten::mm) took 0.2-0.5 more of the step in half of ten captures
    assert growth["core_wait"] is not None and growth["core_wait"] >= WAIT_SHARE, str(growth)
    assert growth["work_factor"] <= MAX_WORK_FACTOR, str(growth)
    assert growth["pattern"] == "uniform", (str(growth), str(diagnosis.details["changes"][:5]),
                                               f"{len(neighbours)} neighbours")
    # five processes on one core, yet each op only 1.7-3.3x slower in 16 runs (the scheduler
    # favours the woken trainer): clearly slowed, not the 5x a fair share would give
    assert growth["factor"] > 1.4
    assert "the whole step slowed uniformly" in diagnosis.message
    assert "waiting for a core" in diagnosis.message and "not your code" in diagnosis.message


def test_slower_loader_diagnosed_as_data_wait_growth(tmp_path):
    delays: list[float] = []

    def slower(base_s: float) -> float:  # 30 ms, or longer where a step takes longer here
        delays.append(max(0.03, SLOW_FACTOR * base_s))
        return delays[-1]

    _, details = slowdown_run(tmp_path, slower_delay=slower)
    first = details["changes"][0]
    assert first["what"] == "data wait", details["changes"][:3]
    assert details["growth"]["pattern"] == "concentrated", details["growth"]  # not the machine
    # the slow steps' wait holds the whole added sleep (a sleep never ends early); how much it
    # grew depends on the baseline's own 2 ms sleep, which beside two CPU burners took 11.6 ms
    # a step (a sleep ends behind the neighbours' turns): held to the run's own numbers
    assert first["after_ms"] >= 0.95 * delays[0] * 1e3, (first, delays)
    assert first["delta_ms"] > 0, first
    assert first["delta_ms"] == pytest.approx(first["after_ms"] - first["before_ms"]), first


def test_baseline_capture_counts_towards_max_captures(tmp_path):
    run(tmp_path, batches(30, 0.0), schedule=None, slowdown=DETECT, max_captures=1)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step")) \
        == ["step000005-baseline"]


def test_baseline_capture_can_be_turned_off(tmp_path):
    run(tmp_path, batches(10, 0.0), schedule=None, slowdown=DETECT, baseline_capture=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("step")]


@pytest.mark.parametrize("value", ["yes", 1])
def test_baseline_capture_validated(tmp_path, value):
    with pytest.raises(ValueError, match="baseline_capture"):
        StepProfiler(tmp_path, baseline_capture=value)


def test_a_restart_into_the_logdir_gets_verdicts_on_its_own_captures(tmp_path):
    # run 1 keeps up with its loader; run 2, restarted into the same logdir with the same
    # schedule, waits for a slow one: its capture is published as step000005-schedule-2
    first = run(tmp_path, batches(12, 0.0, width=1024), width=1024, **SCHEDULED)
    second = run(tmp_path, batches(12, 0.1), **SCHEDULED)
    [before], [after] = verdicts(first), verdicts(second)
    assert before["capture"] == "step000005-schedule" and before["kind"] == "cpu_compute_bound"
    assert after["capture"] == "step000005-schedule-2" and after["kind"] == "input_bound"
    report = build_report(locate_run(tmp_path))
    assert [(c["directory"], c["run"]) for c in report["captures"]] == [
        ("step000005-schedule", 1), ("step000005-schedule-2", 2)]
    [earlier] = report["earlier_runs"]
    assert earlier["run"] == 1 and earlier["captures"] == ["step000005-schedule"]
    assert report["steps"]["last_step"] == 11 and report["steps"]["steps"] <= 12  # run 2 only
    assert report["verdict"]["kind"] == "input_bound"
    # run 2's own findings only: run 1's verdict is counted among the earlier run's
    assert [f["details"]["capture"] for f in report["findings"] if f["kind"] == CAPTURE_VERDICT] \
        == ["step000005-schedule-2"] and earlier["findings"] >= 1
    assert "holds the files of 2 runs" in " ".join(render_text(report).split())


def test_the_restarted_runs_directory_is_the_one_found_for_its_file(tmp_path):
    from profcallbacks.capture.trace_writer import published_dir

    for name in ("step000011-schedule", "step000011-schedule-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank1_h.11.pt.trace.json.gz").write_bytes(b"x")
    found = published_dir(tmp_path, "step000011-schedule", "rank1_h.11.pt.trace.json.gz")
    assert found == tmp_path / "step000011-schedule-2"
