"""What ``profcallbacks report`` says about files that are no trace: a damaged gzip named as such
(no blank report), a file that is not JSON with the place it stops being JSON, JSON that is no
trace named for what it is."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profcallbacks.cli import main

TRACE = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1,
                          "ts": float(i), "dur": 0.5, "args": {"n": "x" * 40}} for i in range(3000)]}


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def damaged_gzip(path: Path) -> Path:
    """A gzipped trace with bytes in the middle of its compressed stream overwritten (a bad disk
    or copy): the header is intact, the data or its checksum is not."""
    data = bytearray(gzip.compress(json.dumps(TRACE).encode()))
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_gzip_is_named_and_no_blank_report_is_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    trace = damaged_gzip(capture / "worker0.1.pt.trace.json.gz")
    code, out, err = cli(capsys, "report", capture)
    assert code == 1 and out == ""  # no "ranks: - (world size 0)"
    assert f"{trace}: corrupt gzip data (" in err and "damaged after it was written" in err
    assert "not a gzip file" not in err and "Traceback" not in err
    assert f"no report: nothing in {capture} could be read" in err


def test_json_output_still_says_what_could_not_be_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = damaged_gzip(tmp_path / "worker0.1.pt.trace.json.gz")
    code, out, _ = cli(capsys, "report", tmp_path, "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["readable"] is False
    assert [p["file"] for p in report["problems"]] == [str(trace)]


@pytest.mark.parametrize("content, where", [
    (b"hello, this is a log file\n", "line 1 column 1 (byte 0)"),
    (b'{"traceEvents": [{"ph": "X",}]}', "byte 28"),  # read as a stream: bytes only
    (b'{"traceEvents": []}\n\n  trailing words', "byte 23"),
])
def test_a_file_that_is_not_json_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            content: bytes, where: str) -> None:
    path = tmp_path / "run.pt.trace.json"
    path.write_bytes(content)
    code, _, err = cli(capsys, "report", path)
    assert code != 0 and f"{path}: invalid JSON at {where}: " in err, err
    assert "not a Chrome trace" not in err and "Traceback" not in err


def test_json_without_trace_events_is_named_for_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "metrics.json"
    path.write_text("[1, 2, 3]")
    code, _, err = cli(capsys, "report", path)
    assert code == 2
    assert f"{path}: not a Chrome trace (a JSON list without a traceEvents list" in err
