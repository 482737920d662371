"""The findings track of a capture's trace: slices over the captured part of a finding's steps,
sync points as instants, the verdict and diagnoses over the capture; other ranks' findings and
those about steps outside the capture left out."""

from __future__ import annotations

from profcallbacks.capture.findings_track import TRACK_CATEGORY, TRACK_PID, findings_track

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
    events = findings_track(STEPS, [_finding("dataloader_stall", 32, first_step=10, last_step=32)],
                            rank=0)
    (stall,) = _by_thread(events)["dataloader_stall"]
    assert (stall["ph"], stall["ts"], stall["dur"]) == ("X", 1000.0, 101.0)  # steps 31-32 only
    assert stall["args"]["message"] == "dataloader_stall message"
    assert stall["args"]["details"]["first_step"] == 10


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
