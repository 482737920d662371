"""Worker timing of real ``DataLoader(num_workers=2)`` runs, under ``fork`` and ``spawn``: the
stall finding names the part of the workers' time that makes the loop wait (fetch, collate,
transfer, start-up) and the dataset's hot line, a healthy loader gets no stall and no worker
timing at all, and a capture carries one track per worker aligned with the loop's waits."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from helpers import QUIET, capture_dirs, load_trace, trace_files
from loader_cases import BigArrays, Cheap, SlowCollate, SlowDecode, SlowInit, marked_line
from profcallbacks import StallConfig, StepProfiler
from profcallbacks.cli import main
from profcallbacks.detect.loader_workers import LoaderWorkers
from profcallbacks.findings import DATALOADER_STALL, DATALOADER_WAIT, Finding
from profcallbacks.watch.rows import loader_workers

STALL = StallConfig(min_duration_s=0.5, min_steps=12)
CONTEXTS = ["fork", "spawn"]


def _train(logdir: Path, loaders: Iterable[Any], *, steps: int, step_s: float = 0.01,
           capture_at: int | None = None, **options: Any) -> StepProfiler:
    """Train ``steps`` steps of ``step_s`` (a sleep: the workers get the cores) over the passes
    ``loaders``; capture 8 steps from ``capture_at``."""
    prof = StepProfiler(logdir, **{**QUIET, "stall": STALL, **options})
    done = 0
    with prof:
        for loader in loaders:
            for _ in prof.wrap(loader):
                time.sleep(step_s)
                prof.step()
                done += 1
                if done == capture_at:
                    prof.capture(8)
                if done >= steps:
                    return prof
    return prof


def _stall(prof: StepProfiler) -> Finding:
    stalls = [f for f in prof.findings if f.kind == DATALOADER_STALL]
    assert stalls, [f.message for f in prof.findings]
    return stalls[0]


def _loader(dataset: Any, ctx: str, **kwargs: Any) -> DataLoader[Any]:
    return DataLoader(dataset, multiprocessing_context=ctx,
                      **{"batch_size": 4, "num_workers": 2, **kwargs})


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_slow_getitem_names_fetch_and_its_line(tmp_path: Path, ctx: str) -> None:
    loader = _loader(SlowDecode(kib=300), ctx)
    prof = _train(tmp_path, [loader], steps=70, step_s=0.005)
    stall = _stall(prof)
    workers = stall.details["loader_workers"]
    assert workers["part"] == "fetch", stall.message
    line = f"loader_cases.py:{marked_line('decode')}"
    assert line in stall.message and "fetch" in stall.message
    hot = workers["workers"]["lines"]
    assert hot[0]["line"].endswith(f"{line} SlowDecode.__getitem__") and hot[0]["phase"] == "fetch"
    assert hot[0]["share"] > 0.5, hot
    rows = workers["workers"]["rows"]
    assert sorted(r["worker"] for r in rows) == [0, 1]
    for row in rows:  # 4 samples of about 8 ms of CPU each, in the fetch
        assert row["fetch_ms"] >= 8 and row["fetch_ms"] > 5 * (row["collate_ms"] + row["send_ms"])
    assert workers["workers_needed"] >= 3 and workers["build_per_s"] < workers["consume_per_s"]
    assert loader.worker_init_fn is None and loader.collate_fn.__name__ == "default_collate"


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_expensive_collate_names_collate_and_its_line(tmp_path: Path, ctx: str) -> None:
    collate = SlowCollate()
    prof = _train(tmp_path, [_loader(Cheap(), ctx, collate_fn=collate)], steps=70, step_s=0.005)
    stall = _stall(prof)
    workers = stall.details["loader_workers"]
    assert workers["part"] == "collate", stall.message
    assert f"loader_cases.py:{marked_line('collate')}" in stall.message
    assert "collate_fn (SlowCollate) cheaper" in stall.message


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_large_tensors_name_the_transfer(tmp_path: Path, ctx: str) -> None:
    # the whole pass, so the workers stop as at an epoch end (torch aborts a spawned worker that is
    # still writing a large batch when its iterator is dropped); one worker: with two the loop
    # waited 37-45% of its step here, and a CI run's loop waited too little for a stall
    prof = _train(tmp_path, [_loader(BigArrays(n=80, mib=48), ctx, batch_size=None, num_workers=1)],
                  steps=81, step_s=0.005)
    stall = _stall(prof)
    workers = stall.details["loader_workers"]
    assert workers["part"] == "transfer", stall.message
    parts = workers["workers"]["parts_ms"]
    assert parts["transfer"] > 5 * parts["fetch"], parts
    assert "send less back to the main process" in stall.message


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_loader_made_again_each_epoch_names_the_start_up(tmp_path: Path, ctx: str) -> None:
    def epochs() -> Iterable[DataLoader[Any]]:
        for _ in range(3):
            yield _loader(Cheap(24), ctx, worker_init_fn=SlowInit(0.4))

    prof = _train(tmp_path, epochs(), steps=18)
    waits = [f for f in prof.findings if f.kind == DATALOADER_WAIT
             and f.details["pattern"] == "startup"]
    restarted = [f for f in waits if f.details["workers_restarted"]]
    assert len(restarted) == 2, [f.message for f in prof.findings]
    for finding in restarted:
        assert finding.details["part"] == "start-up" and "start-up" in finding.message
        assert finding.details["startup_ms"] >= 400  # the worker_init_fn's 0.4 s at least
        assert all(w["init_ms"] >= 390 for w in finding.details["workers_startup_ms"])
        assert "persistent_workers=True" in finding.message


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_healthy_loader_gets_no_stall_and_no_worker_timing(
        tmp_path: Path, ctx: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="profcallbacks"):
        prof = _train(tmp_path, [_loader(Cheap(), ctx, prefetch_factor=8)], steps=60, step_s=0.05)
    assert {f.kind for f in prof.findings} <= {DATALOADER_WAIT}  # the workers' first start
    assert not [f for f in prof.findings if "loader_workers" in f.details]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_capture_window_times_a_healthy_loader_without_sampling_it(tmp_path: Path) -> None:
    """A window records the workers' tracks (timing on), but the stack sampler runs only while
    a stall opens or is open: none here (only a loop waiting 90% of its time would open one, so a
    loaded machine's delays do not), so no worker ever published a sample."""
    never = StallConfig(share_threshold=0.9, clear_share=0.9, min_duration_s=0.5, min_steps=12)
    prof = _train(tmp_path, [_loader(Cheap(), "fork", prefetch_factor=8)], steps=30,
                  step_s=0.02, capture_at=10, max_captures=1, stall=never)
    assert not [f for f in prof.findings if "loader_workers" in f.details]
    [capture] = capture_dirs(tmp_path)
    [path] = trace_files(capture)
    tracks = [e for e in load_trace(path)["traceEvents"]
              if e.get("cat") == "profcallbacks_loader_worker" and e.get("ph") == "X"]
    assert {e["args"]["phase"] for e in tracks} >= {"fetch", "send"}, tracks
    assert prof.session.loader_workers.hot_lines() == []


def test_timing_runs_only_while_the_loop_waits() -> None:
    """Off while the loop does not wait (a healthy loader), on over a period of waiting for a
    share of its time at least ``share_on``, off again after a period under it."""
    workers = LoaderWorkers(lambda: 0, share_on=0.2)
    loader = _loader(Cheap(800), "fork")
    batches = workers.iterate(loader)
    t = 1000.0
    for _ in range(2):  # the workers' first batches: start-up, left out
        next(batches)
        workers.fetched(t, t + 0.5)
        t += 0.5
    for _ in range(40):  # 1 ms waits in 10 ms steps: 10%
        next(batches)
        workers.fetched(t, t + 0.001)
        t += 0.01
    assert not workers.timing and not workers.waits
    for _ in range(30):  # 5 ms waits in 10 ms steps: 50%
        next(batches)
        workers.fetched(t, t + 0.005)
        t += 0.01
    assert workers.timing and workers.waits
    assert loader.worker_init_fn is None  # the loader keeps its own
    for _ in range(60):  # two whole periods of 5%
        next(batches)
        workers.fetched(t, t + 0.0005)
        t += 0.01
    assert not workers.timing


def _waits(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The loop's ``__next__`` ranges, in order: the ``j``-th fetched the ``j``-th batch."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if str(e.get("name", "")).startswith("enumerate(DataLoader)")
                  and e.get("ph") == "X")


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_worker_tracks_overlap_the_loops_waits_for_the_same_batches(tmp_path: Path,
                                                                    ctx: str) -> None:
    _train(tmp_path, [_loader(SlowDecode(kib=250), ctx)], steps=40, capture_at=25,
           max_captures=1)
    [capture] = capture_dirs(tmp_path)
    [path] = trace_files(capture)
    events = load_trace(path)["traceEvents"]
    tracks = [e for e in events if e.get("cat") == "profcallbacks_loader_worker"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M"
             and e.get("name") == "thread_name" and e.get("pid") == tracks[0]["pid"]}
    assert names == {"training loop waits", "DataLoader worker 0", "DataLoader worker 1"}
    spans = {(e["args"]["phase"], e["args"]["batch"]): (e["ts"], e["ts"] + e["dur"])
             for e in tracks}
    waits = {b: span for (phase, b), span in spans.items() if phase == "wait"}
    # torch's own range of each fetch in the window, and the batch it fetched: the track's
    # wait that starts with it (one clock: within 0.5 ms)
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X"
                    and str(e.get("name", "")).startswith("enumerate(DataLoader)"))
    fetched = {}
    for start, end in ranges:
        near = [b for b, (a, _) in waits.items() if abs(a - start) < 500]
        if near:
            fetched[near[0]] = (start, end)
    assert len(fetched) >= 0.8 * len(ranges) >= 4, (ranges, waits)
    timed = {b: r for b, r in fetched.items() if ("send", b) in spans}
    assert len(timed) >= 4, (timed, spans)
    # no batch reaches the loop before its send began (the send's end is read after the hand-off
    # to the queue's feeder thread returns, which a descheduled worker may note after the loop
    # already has the batch)
    for batch, (_, end) in timed.items():
        assert spans["fetch", batch][0] < spans["send", batch][0] <= end + 500, batch
    # a loader slower than the loop: some long waits (over 3 ms) overlap the work of the batch
    # they wait for (on a loaded machine others wait after the send, for the transfer)
    long = {b: r for b, r in timed.items() if r[1] - r[0] > 3000}
    overlapping = [b for b, (start, end) in long.items() if spans["send", b][1] > start]
    assert len(long) >= 2 and overlapping, (long, spans)


def test_the_workers_clock_offset_comes_from_the_tightest_reading(monkeypatch) -> None:
    # Reasoning: the wall clock is 1 s ahead of perf_counter. The first reading's thread waits
    # 5 ms between its perf_counter and wall reads (a neighbour's turn): taken alone, the offset
    # is 2.5 ms off. The second reads within 100 ns: the offset, exactly.
    from profcallbacks.capture import worker_tracks

    perf = iter([0, 5_000_100, 6_000_000, 6_000_100])
    wall = iter([1_005_000_000, 1_006_000_050])
    monkeypatch.setattr(worker_tracks.time, "perf_counter_ns", lambda: next(perf))
    monkeypatch.setattr(worker_tracks.time, "time_ns", lambda: next(wall))
    assert worker_tracks.wall_minus_perf_ns(reads=2) == 1_000_000_000


def test_timing_can_be_turned_off(tmp_path: Path) -> None:
    loader = _loader(SlowDecode(kib=150), "fork")
    prof = _train(tmp_path, [loader], steps=70, step_s=0.005,
                  stall=StallConfig(min_duration_s=0.5, min_steps=12, time_workers=False))
    stall = _stall(prof)
    assert "loader_workers" not in stall.details and "Inside the loader" not in stall.message
    with pytest.raises(ValueError, match=r"StallConfig\(time_workers='yes'\).*time_workers=False"):
        StallConfig(time_workers="yes")  # type: ignore[arg-type]


def test_a_loader_whose_timing_cannot_be_set_up_runs_as_without_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Frozen(DataLoader[Any]):  # refuses new attributes after construction
        def __setattr__(self, name: str, value: object) -> None:
            if name in ("worker_init_fn", "collate_fn") and hasattr(self, "_frozen"):
                raise AttributeError(f"{name} is read-only")
            super().__setattr__(name, value)

    loader = Frozen(Cheap(40), num_workers=2, batch_size=4, multiprocessing_context="fork")
    loader._frozen = True
    with caplog.at_level(logging.WARNING, logger="profcallbacks"):
        prof = StepProfiler(tmp_path, **{**QUIET, "stall": STALL})
        with prof:
            got = [int(b[0, 0]) for b in prof.wrap(loader) if not prof.step()]
    assert got == list(range(0, 40, 4))
    warned = [r.getMessage() for r in caplog.records if "worker timing is off" in r.getMessage()]
    assert len(warned) == 1 and "read-only" in warned[0]



def test_watch_and_the_report_show_the_per_worker_table_of_an_input_bound_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = _train(tmp_path / "run", [_loader(SlowDecode(kib=150), "fork")], steps=60, step_s=0.005)
    rows = _stall(prof).details["loader_workers"]["workers"]["rows"]
    line = f"loader_cases.py:{marked_line('decode')}"
    capsys.readouterr()
    assert main(["watch", str(tmp_path / "run"), "--once"]) == 0
    out = capsys.readouterr().out
    assert "Loader workers (largest part: fetch" in out, out
    assert line in out
    table = out[out.index("Loader workers"):]
    assert all(f"│ {w} │" in table or f"  {w} " in table for w in (0, 1))
    # the report, as text: the recorded finding's rows, worker by worker, and the hot line
    assert main(["report", str(tmp_path / "run")]) == 0
    text = capsys.readouterr().out
    section = text[text.index("\nLoader workers\n"):]
    assert "largest part: fetch" in section.splitlines()[2], section
    for row in rows:
        cells = next(r.split() for r in section.splitlines()[5:7] if r.split()[0] == str(row["worker"]))
        assert cells[1] == str(row["batches"]) and cells[2] == f"{row['fetch_ms']:.1f}", section
    assert f"hot line: tests/{line} SlowDecode.__getitem__ (fetch)" in section, section
    # and as HTML: the same table
    assert main(["report", str(tmp_path / "run"), "--format", "html", "-o",
                 str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    block = html[html.index("<table id=loader-workers>"):]
    block = block[:block.index("</table>")]
    assert block.count("<tr>") == 3 and "<th>fetch ms</th>" in block
    assert all(f"<td class=num>{row['fetch_ms']:.1f}</td>" in block for row in rows), block
    assert line in html[html.index("<h2>Loader workers</h2>"):]


def test_watch_skips_a_hostile_worker_table() -> None:
    rows = {"loader_workers": {"part": "\x1b[31mfetch", "workers_needed": "many", "workers": {
        "rows": [{"worker": -1}, {"worker": 0, "batches": True, "fetch_ms": float("nan")}, 7],
        "lines": [{"line": "x.py:1 \x07", "share": float("inf")}]}}}
    table = loader_workers(rows)
    assert table is not None
    assert table["rows"] == [{"worker": 0, "batches": None}]
    assert table["part"] == "\\x1b[31mfetch" and table["needed"] is None
    assert table["line"] == "x.py:1 \\x07"
    assert loader_workers({"loader_workers": {"workers": "rows"}}) is None
