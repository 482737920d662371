"""Issue 17 item 9: the report on hostile input. Every malformed event or file is a named problem
and the rest is reported; nothing blocks, explodes in memory or reaches a terminal raw."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from faults_helpers import copied_run, small_run
from profcallbacks.cli import main
from profcallbacks.report import build_report, locate_run, render_html, render_text
from profcallbacks.report.render.safe import dumps_strict, visible

GOOD_STEP = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 1000.0,
             "dur": 500.0, "pid": 1, "tid": 1}
GOOD_OP = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1100.0, "dur": 100.0, "pid": 1,
           "tid": 1}


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    return small_run(tmp_path_factory.mktemp("base"), 20)


@pytest.fixture
def run(base_run, tmp_path) -> Path:
    return copied_run(base_run, tmp_path)


def _trace(logdir: Path, events, name="step000009-manual") -> Path:
    capture = logdir / name
    capture.mkdir()
    path = capture / "rank0_h.9.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(events if isinstance(events, str) else json.dumps({"traceEvents": events}))
    return path


def _report(logdir: Path) -> dict:
    report = build_report(locate_run(logdir))
    render_text(report).encode("utf-8")  # every renderer works and its output is encodable
    render_html(report).encode("utf-8")
    json.loads(dumps_strict(report), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    return report


def _problem(report: dict, path: Path) -> str:
    (error,) = [p["error"] for p in report["problems"] if p["file"] == str(path)]
    return error


def test_malformed_events_are_skipped_and_named(run):
    bad = [42, "x", None, [1], {"ph": "X", "cat": "cpu_op", "ts": "abc"},
           {"ph": "X", "cat": "cpu_op", "name": "no ts"}, {**GOOD_OP, "dur": None},
           {**GOOD_OP, "ts": "1e400"}, {**GOOD_OP, "pid": [1]},
           {**GOOD_STEP, "name": "ProfilerStep#" + "9" * 400}]
    path = _trace(run, [GOOD_STEP, GOOD_OP, *bad])
    report = _report(run)
    assert "skipped 8 malformed event(s)" in _problem(report, path)
    capture = next(c for c in report["captures"] if c["directory"] == "step000009-manual")
    assert capture["steps"] == [-1, 7]  # the good step, and the huge one with its number unknown
    assert report["captures"][0]["steps"] == [2, 3]  # the run's own capture is still reported
    assert report["steps"] is not None


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000,
                                     '{"traceEvents": ' + "[" * 5000 + "]" * 5000 + "}",
                                     '{"traceEvents": 5}', "[1, 2]", "{"])
def test_a_malformed_trace_file_is_one_named_problem(run, content):
    path = _trace(run, content)
    report = _report(run)
    assert _problem(report, path)
    assert report["captures"][0]["steps"] == [2, 3] and report["readable"]


def test_hostile_lines_in_steps_and_findings_files_are_skipped(run):
    steps = run / "profcallbacks" / "rank0.steps.jsonl"
    good = steps.read_text().splitlines()
    hostile = ['{"rank": 0, "first_step": 0, "last_step": 4, "steps": 5, "step_time_ms": Infinity}',
               '{"rank": 0, "first_step": 0, "last_step": 4, "steps": 5, "step_time_ms": NaN}',
               '{"rank": 0, "first_step": 0, "last_step": 4, "steps": 5, "step_time_ms": 1e400}',
               '{"rank": 0, "first_step": 1' + "0" * 400 + ', "last_step": 4, "steps": 5}',
               "[" * 100_000, "[]"]
    steps.write_text("\n".join(good + hostile) + "\n")
    findings = run / "profcallbacks" / "rank0.findings.jsonl"
    finding = {"kind": "step_slowdown", "step": 3, "rank": 0, "severity": "warning",
               "message": "slow \ud800 step"}
    findings.write_text(json.dumps(finding) + "\n" + '{"kind": "x", "details": '
                        + "{\"a\": " * 5000 + "1" + "}" * 5000 + "}\n")
    report = _report(run)
    assert f"skipped {len(hostile)} unreadable line(s)" in _problem(report, steps)
    assert "skipped 1 unreadable line(s)" in _problem(report, findings)
    assert report["steps"]["steps"] == 20  # the good rows are all there
    assert "slow \\ud800 step" in render_text(report)
    assert "slow \\ud800 step" in render_html(report)


def test_a_fifo_steps_file_never_blocks_the_report(run):
    steps = run / "profcallbacks" / "rank1.steps.jsonl"
    os.mkfifo(steps)
    result = {}
    thread = threading.Thread(target=lambda: result.update(report=_report(run)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the report hangs on a FIFO"
    assert "not a regular file" in _problem(result["report"], steps)


def test_a_fifo_or_device_trace_is_not_read(run):
    capture = run / "step000009-manual"
    capture.mkdir()
    fifo = capture / "rank0_h.9.pt.trace.json.gz"
    os.mkfifo(fifo)
    os.symlink("/dev/zero", capture / "rank1_h.9.pt.trace.json")
    start = time.perf_counter()
    report = _report(run)
    assert time.perf_counter() - start < 20
    assert report["captures"][0]["steps"] == [2, 3]
    assert any(c["directory"] == "step000009-manual" for c in report["captures"])


def test_a_gzip_bomb_is_stopped_early(run):
    capture = run / "step000009-manual"
    capture.mkdir()
    path = capture / "rank0_h.9.pt.trace.json.gz"
    spaces = gzip.compress(b" " * (64 << 20), compresslevel=9)  # one gzip member: 64 MB -> 64 KB
    path.write_bytes(gzip.compress(b'{"traceEvents": [') + spaces * 48)  # 3 GB in 3 MB
    assert path.stat().st_size < (4 << 20)
    start = time.perf_counter()
    report = _report(run)
    assert time.perf_counter() - start < 15
    assert "gzip bomb" in _problem(report, path)


def test_escape_sequences_and_bidi_overrides_are_shown_not_obeyed(run):
    hostile = "aten::evil\x1b]8;;http://x\x07\x1b[2J\u202etxt.exe\u2066"
    _trace(run, [GOOD_STEP, {**GOOD_OP, "name": hostile}])
    report = _report(run)
    text, html = render_text(report), render_html(report)
    for out in (text, html):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
        assert "\u2066" not in out
    assert "aten::evil\\x1b]8;;http://x\\x07\\x1b[2J\\u202etxt.exe" in text


@pytest.mark.parametrize("fmt", ["text", "html"])
def test_run_names_of_a_parent_directory_are_shown_not_obeyed(run, tmp_path, capsys, fmt):
    """``report PARENT`` lists several runs by their directory names: whoever made a directory
    chose its name."""
    parent = tmp_path / "parent"
    hostile = "exp\x1b]0;owned\x07\x1b[2J\u202e"
    shutil.copytree(run, parent / hostile)
    shutil.copytree(run, parent / "exp2")
    code = main(["report", str(parent), "--format", fmt])
    out, err = capsys.readouterr()
    assert code == (0 if fmt == "text" else 2)
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream and "\u202e" not in stream
    if fmt == "text":  # listed, escaped (HTML is of one run: refused, naming only the parent)
        assert "exp\\x1b]0;owned\\x07\\x1b[2J\\u202e" in out


def test_json_output_is_strict(run, capsys):
    steps = run / "profcallbacks" / "rank0.steps.jsonl"
    with steps.open("a") as f:
        f.write('{"rank": 0, "first_step": 20, "last_step": 24, "steps": 5, '
                '"step_time_ms": Infinity}\n')
    assert main(["report", str(run), "--format", "json"]) == 0
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    assert json.loads(dumps_strict({"a": float("nan"), "b": [float("inf")]})) == {"a": None,
                                                                                 "b": [None]}


def test_visible_escapes():
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible("\x1b[31m\x9b\u200f\ud800") == "\\x1b[31m\\x9b\\u200f\\ud800"


def _as_nobody(*args: str) -> tuple[int, str]:
    """``profcallbacks ARGS`` run as user nobody (root reads every directory): (status, stderr)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run the CLI, report its exit status
        status = 3
        try:
            os.dup2(write, 2)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            status = main(list(args))
            sys.stderr.flush()
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


@pytest.fixture
def public_run(base_run):
    if os.geteuid() != 0:
        pytest.skip("needs root to run the report as another user (root reads every directory)")
    parent = Path(tempfile.mkdtemp(prefix="profcallbacks-public-"))
    os.chmod(parent, 0o755)
    logdir = parent / "run"
    shutil.copytree(base_run, logdir)
    for path in [logdir, *logdir.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    yield logdir
    shutil.rmtree(parent)


def test_unreadable_capture_and_meta_directories_are_named(public_run):
    (capture,) = [p for p in public_run.iterdir() if p.name.startswith("step")]
    for directory in (capture, public_run / "profcallbacks"):
        os.chmod(directory, 0o711)  # can pass through, cannot list
    status, err = _as_nobody("report", str(public_run))
    assert status in (0, 1), err
    assert f"skipped {capture}: cannot list it (Permission denied)" in err
    assert f"skipped {public_run / 'profcallbacks'}: cannot list it" in err
    assert "Traceback" not in err


def test_an_unreadable_logdir_is_not_called_empty(public_run):
    os.chmod(public_run, 0o700)
    status, err = _as_nobody("report", str(public_run))
    assert status == 2, err
    assert "cannot read it (Permission denied)" in err
    assert "no profcallbacks run here" not in err
