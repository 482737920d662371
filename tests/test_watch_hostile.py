"""`profcallbacks watch` on a log directory written by a hostile co-user: every bad line is skipped
and counted, every string is shown as visible text, and nothing reaches the terminal as an escape
sequence, a rich markup tag or a hyperlink."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from profcallbacks.layout import META_DIR
from profcallbacks.watch import WatchOptions, watch

GOOD_STEPS = {"rank": 0, "first_step": 0, "last_step": 9, "steps": 10, "step_time_ms": 1.1,
              "step_time_ms_median": 1.0, "step_time_ms_max": 2.0, "data_wait_share": 0.1}

BAD_STEPS = {  # raw JSON text of a steps row that must be skipped
    "last_step NaN": '{"last_step": NaN, "steps": 10, "step_time_ms_median": 1.0}',
    "last_step text": '{"last_step": "abc", "steps": 10, "step_time_ms_median": 1.0}',
    "last_step 1e400": '{"last_step": 1e400, "steps": 10, "step_time_ms_median": 1.0}',
    "last_step 10**30": '{"last_step": 1000000000000000000000000000000, "steps": 10, '
                        '"step_time_ms_median": 1.0}',
    "steps text": '{"last_step": 19, "steps": "many", "step_time_ms_median": 1.0}',
    "steps Infinity": '{"last_step": 19, "steps": Infinity, "step_time_ms_median": 1.0}',
    "steps negative": '{"last_step": 19, "steps": -5, "step_time_ms_median": 1.0}',
    "median NaN": '{"last_step": 19, "steps": 10, "step_time_ms_median": NaN}',
    "median text": '{"last_step": 19, "steps": 10, "step_time_ms_median": "fast"}',
    "last_step true": '{"last_step": true, "steps": 10, "step_time_ms_median": 1.0}',
}

HOSTILE_TEXT = {  # a string of a finding, and what must never reach the terminal because of it
    "markup close tag": ("[/bold] oops", None),
    "markup hyperlink": ("[link=https://evil.example/x]click[/link]", "\x1b]8;"),
    "OSC 0 title": ("\x1b]0;owned\x07", "\x1b]0;"),
    "OSC 52 clipboard": ("\x1b]52;c;ZXZpbA==\x07", "\x1b]52;"),
    "CSI 2J clear": ("\x1b[2J cleared", "\x1b[2J"),
    "OSC 8 hyperlink": ("\x1b]8;;https://evil.example\x1b\\x\x1b]8;;\x1b\\", "\x1b]8;"),
    "bidi override": ("abc\u202edef", "\u202e"),
}


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")  # one line per row, as on a wide terminal


class Terminal(io.StringIO):
    """Output that says it is a terminal, so rich writes what it would write to one."""

    def isatty(self) -> bool:
        return True


def _logdir(tmp_path: Path, steps: list[str], findings: list[dict[str, object]]) -> Path:
    meta = tmp_path / "run" / META_DIR
    meta.mkdir(parents=True)
    (meta / "rank0.steps.jsonl").write_text("".join(line + "\n" for line in steps))
    (meta / "rank0.findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    return tmp_path / "run"


def _frame(logdir: Path) -> str:
    out = Terminal()
    assert watch(logdir, WatchOptions(once=True), stream=out) == 0
    return out.getvalue()


@pytest.mark.parametrize("case", list(BAD_STEPS))
def test_a_bad_steps_row_is_skipped_and_counted(tmp_path: Path, case: str) -> None:
    logdir = _logdir(tmp_path, [json.dumps(GOOD_STEPS), BAD_STEPS[case]], [])
    frame = _frame(logdir)
    assert "skipped 1 unreadable line(s)" in frame
    assert "step 9" in frame  # the good row is still shown


@pytest.mark.parametrize("field", ["message", "kind", "severity"])
@pytest.mark.parametrize("case", list(HOSTILE_TEXT))
def test_hostile_finding_text_is_shown_as_visible_text(tmp_path: Path, case: str, field: str) -> None:
    value, forbidden = HOSTILE_TEXT[case]
    finding = {"kind": "sync_point", "step": 3, "rank": 0, "severity": "warning",
               "message": "host waits", "details": {}} | {field: value}
    frame = _frame(_logdir(tmp_path, [json.dumps(GOOD_STEPS)], [finding]))
    assert "findings 1" in frame
    for seq in ("\x1b]", "\x07", "\x1b[2J", "\u202e"):  # OSC, BEL, clear screen, bidi override
        assert seq not in frame
    if forbidden is None:  # a markup tag is shown as written
        assert value in frame
    else:
        assert forbidden not in frame


def test_hostile_memory_keys_and_verdict_fields_are_not_shown_raw(tmp_path: Path) -> None:
    steps = dict(GOOD_STEPS, **{"process_rss_mb": 512.0, "planted\x1b]0;t\x07_mb": 5.0})
    verdict = {"kind": "capture_verdict", "step": 5, "rank": 0, "severity": "info",
               "message": "verdict", "details": {"capture": "step000005-schedule", "verdict": {
                   "kind": "[link=https://evil.example]host_bound\x1b[2J", "share": "high",
                   "diagnoses": [{"kind": "\x1b]0;x\x07", "gain_ms": "lots"}]}}}
    logdir = _logdir(tmp_path, [json.dumps(steps)], [verdict])
    (logdir / "step000005-schedule").mkdir()
    frame = _frame(logdir)
    assert "rss 512" in frame and "planted" not in frame
    assert "host_bound" in frame and "\x1b]" not in frame and "\x1b[2J" not in frame
