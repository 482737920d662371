"""The findings track of a capture's trace: slices over the captured part of a finding's steps,
sync points as instants, the verdict and diagnoses over the capture; other ranks' findings and
those about steps outside the capture left out."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import capture_dirs, load_trace, torchrun, trace_files
from profcallbacks.capture.findings_track import TRACK_CATEGORY, TRACK_PID, findings_track
from profcallbacks.layout import MERGED_FILE
from profcallbacks.report import build_report, locate_run
from sync_scenario import __file__ as SYNC_FILE
from sync_scenario import marked_line

STEPS = [(31, 1000.0, 1050.0), (32, 1050.0, 1101.0), (33, 1101.0, 1160.0)]


def _finding(kind: str, step: int, rank: int = 0, **details: object) -> dict[str, object]:
    return {"kind": kind, "step": step, "rank": rank, "severity": "warning",
            "message": f"{kind} message", "details": details}


def _by_thread(events: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    out: dict[str, list[dict[str, object]]] = {}
    for e in events:
        if e["ph"] != "M":
            out.setdefault(names[e["tid"]], []).append(e)
    return out


def test_a_stall_episode_covers_the_captured_part_of_its_steps() -> None:
    alert = _finding("dataloader_stall", 20, first_step=10, last_step=20)
    cleared = _finding("dataloader_stall_cleared", 32, first_step=10, last_step=32)
    threads = _by_thread(findings_track(STEPS, [alert, cleared], rank=0))
    (stall,) = threads["dataloader_stall"]  # the cleared finding ends it, no slice of its own
    assert set(threads) == {"dataloader_stall"}
    assert (stall["ph"], stall["ts"], stall["dur"]) == ("X", 1000.0, 101.0)  # steps 31-32 only
    assert stall["args"]["message"] == "dataloader_stall message"
    assert stall["args"]["details"]["first_step"] == 10


def test_a_stall_still_holding_covers_the_whole_capture() -> None:
    alert = _finding("dataloader_stall", 20, first_step=10, last_step=20)  # alerted, not cleared
    (stall,) = _by_thread(findings_track(STEPS, [alert], rank=0))["dataloader_stall"]
    assert (stall["ts"], stall["dur"]) == (1000.0, 160.0)
    over = _finding("dataloader_stall_cleared", 25, first_step=10, last_step=25)  # before it
    assert findings_track(STEPS, [alert, over], rank=0) == []


def test_sync_points_are_instants_named_by_their_line() -> None:
    inside = _finding("sync_point", 33, location="train.py:56", calls_per_step=1)
    found_earlier = _finding("sync_point", 20, location="train.py:61", calls_per_step=2)
    once = _finding("sync_point", 5, location="train.py:90")  # not recurring, not captured
    syncs = _by_thread(findings_track(STEPS, [inside, found_earlier, once], rank=0))["sync_point"]
    assert [(e["ph"], e["name"], e["ts"]) for e in syncs] == [
        ("i", "sync: train.py:56", 1101.0), ("i", "sync: train.py:61", 1000.0)]


def test_verdict_and_diagnoses_span_the_capture_and_other_ranks_are_left_out() -> None:
    verdict = {"kind": "input_bound", "share": 0.8, "evidence": ["data wait 41 ms"], "advice": ["x"]}
    diagnoses = [{"kind": "input_pipeline", "gain_ms": 12.5, "fix": ["num_workers=2"]}]
    other_rank = _finding("dataloader_stall", 32, rank=1, first_step=31, last_step=33)
    outside = _finding("step_slowdown", 90)
    events = findings_track(STEPS, [other_rank, outside], rank=0, verdict=verdict,
                            diagnoses=diagnoses)
    threads = _by_thread(events)
    assert set(threads) == {"verdict", "diagnoses"}
    assert [(e["name"], e["ts"], e["dur"]) for e in threads["verdict"]] == [
        ("verdict: input_bound (80%)", 1000.0, 160.0)]
    assert threads["diagnoses"][0]["name"] == "input_pipeline (up to 12.50 ms/step)"
    assert all(e["pid"] == TRACK_PID for e in events)
    assert all(e["cat"] == TRACK_CATEGORY for e in events if e["ph"] != "M")
    process = next(e for e in events if e["name"] == "process_name")
    assert process["args"]["name"] == "profcallbacks findings (rank 0)"


def test_nothing_to_show_adds_no_events() -> None:
    assert findings_track(STEPS, [_finding("step_slowdown", 90)], rank=0) == []
    assert findings_track([], [_finding("dataloader_stall", 1, first_step=0, last_step=5)], rank=0) == []


# --- the track in the traces a real run exports -------------------------------------------------

SCRIPT = Path(__file__).parent / "dist_scripts" / "findings_track_dist.py"
CAPTURED = [14, 15, 16]


def _is_track(event: object) -> bool:
    return isinstance(event, dict) and (event.get("cat") == TRACK_CATEGORY
                                        or event.get("pid") == TRACK_PID)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two gloo ranks with a stall from step 1 on and a sync point on a marked line, captured at
    steps 14-16 (the stall still holding)."""
    logdir = tmp_path_factory.mktemp("track") / "logs"
    proc = torchrun(SCRIPT, 2, "--logdir", str(logdir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logdir


def _step_bounds(events: list[dict[str, Any]], pid: object) -> dict[int, tuple[float, float]]:
    return {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
            if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("pid") == pid}


@pytest.mark.slow
def test_each_rank_trace_carries_its_stall_sync_points_and_verdict(gloo_run: Path) -> None:
    [capture] = capture_dirs(gloo_run)
    files = trace_files(capture)
    assert len(files) == 2
    for path in files:
        trace = load_trace(path)
        rank = trace["distributedInfo"]["rank"]
        events = trace["traceEvents"]
        track = [e for e in events if _is_track(e)]
        process = [e for e in track if e.get("name") == "process_name"]
        assert [p["args"]["name"] for p in process] == [f"profcallbacks findings (rank {rank})"]
        threads = _by_thread(track)
        steps = _step_bounds(events, trace["profcallbacks"] and next(
            e["pid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")))
        assert sorted(steps) == CAPTURED
        start, end = steps[CAPTURED[0]][0], steps[CAPTURED[-1]][1]
        (stall,) = threads["dataloader_stall"]  # alerted at step ~8, still holding: the capture
        assert (stall["ts"], stall["ts"] + stall["dur"]) == pytest.approx((start, end))
        assert stall["args"]["details"]["first_step"] <= 8
        syncs = {e["name"].rsplit("/", 1)[-1] for e in threads["sync_point"]}
        assert syncs == {f"sync_scenario.py:{marked_line(m, SYNC_FILE)}"
                         for m in ("item", "nonzero")}
        assert all(e["ph"] == "i" and e["ts"] == start for e in threads["sync_point"])
        (verdict,) = threads["verdict"]
        assert verdict["name"].startswith("verdict: ") and verdict["args"]["kind"]
        assert (verdict["ts"], verdict["dur"]) == pytest.approx((start, end - start))
        assert [e["name"].split(" (")[0] for e in threads["diagnoses"]] == [
            d["kind"] for d in verdict["args"]["diagnoses"]]
        assert all(e["pid"] == TRACK_PID and e["cat"] == TRACK_CATEGORY
                   for e in track if e["ph"] != "M")


@pytest.mark.slow
def test_the_merged_trace_carries_every_ranks_track(gloo_run: Path) -> None:
    [capture] = capture_dirs(gloo_run)
    [merged] = [p for p in capture.iterdir() if MERGED_FILE.match(p.name)]
    events = load_trace(merged)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    track = [e for e in events if e.get("cat") == TRACK_CATEGORY]
    by_rank: dict[str, set[str]] = {}
    for e in track:
        by_rank.setdefault(processes[e["pid"]], set()).add(threads[e["pid"], e["tid"]])
    assert sorted(by_rank) == sorted(processes.values()) and len(by_rank) == 2
    for names in by_rank.values():
        assert {"verdict", "diagnoses", "sync_point", "dataloader_stall"} <= names
    for pid in processes:  # each rank's stall over its own (aligned) captured steps
        steps = _step_bounds(events, pid)
        (stall,) = [e for e in track if e["pid"] == pid and e["name"] == "dataloader_stall"]
        assert stall["ts"] == pytest.approx(steps[CAPTURED[0]][0], abs=1e-3)


def _strip_tracks(logdir: Path) -> None:
    for path in logdir.rglob("*.trace.json.gz"):
        trace = load_trace(path)
        trace["traceEvents"] = [e for e in trace["traceEvents"] if not _is_track(e)]
        path.write_bytes(gzip.compress(json.dumps(trace, separators=(",", ":")).encode()))


def _without_sizes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_sizes(v) for k, v in value.items() if k != "bytes"}
    if isinstance(value, list):
        return [_without_sizes(v) for v in value]
    return value


@pytest.mark.slow
def test_the_report_is_the_same_with_and_without_the_track(gloo_run: Path,
                                                             tmp_path: Path) -> None:
    with_track, without = tmp_path / "with", tmp_path / "without"
    shutil.copytree(gloo_run, with_track)
    shutil.copytree(gloo_run, without)
    _strip_tracks(without)
    assert not any(_is_track(e) for p in without.rglob("*.trace.json.gz")
                   for e in load_trace(p)["traceEvents"])
    reports = [json.loads(json.dumps(_without_sizes(build_report(locate_run(d), summaries=False)),
                                     default=str)  # the traces themselves, not their summaries
                          .replace(str(d), "LOGDIR")) for d in (with_track, without)]
    assert reports[0] == reports[1]
    [capture] = reports[0]["captures"]
    assert capture["verdict"]["kind"] and capture["diagnoses"]
    assert "input_pipeline" in {d["kind"] for d in capture["diagnoses"]}  # the stall
