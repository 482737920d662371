"""The README shows what the demo prints: its findings and the report's verdict block, in the
shape and with the verdict kind the demo (``examples/plain_loop.py``, then ``profcallbacks
report``, as ``scripts/demo.sh`` runs them) prints now, under the report's header."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from profcallbacks.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_NUMBER = re.compile(r"\d+(\.\d+)?")

pytestmark = pytest.mark.slow


def _shape(text: str) -> str:
    """``text`` with its numbers as ``N`` and its spaces collapsed."""
    return " ".join(_NUMBER.sub("N", text).split())


def _blocks() -> list[str]:
    """The README's ``text`` blocks under "What you see"."""
    section = README.read_text().split("## What you see", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```text\n(.*?)```", section, re.S)


def _findings(block: str) -> list[str]:
    """The block's findings, continuation lines joined."""
    out: list[str] = []
    for line in block.splitlines():
        if line.startswith("finding: "):
            out.append(line)
        elif out and line.startswith("  "):
            out[-1] += " " + line.strip()
    return out


def _verdict_block(text: str) -> list[str]:
    """The report's verdict line and its items (continuation lines left out)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Verdict: "))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.strip():
            break
        if re.match(r"  (- |try:|[a-z]+:)", line):
            block.append(line.split(":")[0] if line.startswith("  - top") or
                         line.startswith("  try") else line)
    return block


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """What the demo prints: the loop's output and the report's text."""
    demo_sh = (ROOT / "scripts" / "demo.sh").read_text()
    assert "examples/plain_loop.py --logdir runs/demo" in demo_sh
    assert "profcallbacks report runs/demo" in demo_sh
    logdir = tmp_path_factory.mktemp("demo") / "runs" / "demo"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "plain_loop.py"),
                           "--logdir", str(logdir)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, str(logdir)


def test_the_readme_findings_are_what_the_demo_prints(demo: tuple[str, str]) -> None:
    printed, _ = demo
    shown = _findings(_blocks()[0])
    assert shown, "the README shows no finding"
    printed_shapes = [_shape(line) for line in printed.splitlines() if line.startswith("finding: ")]
    for finding in shown:
        head = _shape(finding.removesuffix("...").rstrip())
        assert any(p.startswith(head) for p in printed_shapes), (finding, printed_shapes)


def test_the_readme_verdict_is_the_demos_under_the_report_header(
        demo: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, logdir = demo
    capsys.readouterr()
    assert main(["report", logdir]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == f"profcallbacks report: {logdir}"
    assert lines.index(next(x for x in lines if x.startswith("Verdict: "))) > 1  # under it
    shown = _blocks()[1]
    assert shown.splitlines()[0] == "profcallbacks report: runs/demo"
    readme, real = _verdict_block(shown), _verdict_block(text)
    assert [_shape(x) for x in readme] == [_shape(x) for x in real], (readme, real)


def test_a_cpu_capture_claims_no_gflop_and_asks_for_no_peak(
        demo: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, logdir = demo
    capsys.readouterr()
    assert main(["report", logdir]) == 0
    text = capsys.readouterr().out
    rates = [line for line in text.splitlines() if "throughput:" in line]
    assert rates and all("--peak-tflops" not in r and "0.00 GFLOP" not in r for r in rates)
    assert all(re.search(r"\d+(\.\d+)? [kMGT]?FLOP per step in matrix products", r) for r in rates)
