"""The report and the profiler inline in a notebook (``_repr_html_``), rendered by Chromium."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from profcallbacks import StepProfiler
from profcallbacks.report.notebook import SCOPE, Report, scoped_css
from report_runs import NASTY, plain_run
from test_report_html import CHROMIUM, FLAGS

# What Jupyter does with an object's _repr_html_: the fragment goes into an output cell's div.
NOTEBOOK = """<!DOCTYPE html><html><head><meta charset=utf-8><title>notebook</title></head><body>
<h1 id=notebook-title>My notebook</h1><div class="jp-OutputArea-output">{cell}</div></body></html>
"""


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return plain_run(tmp_path_factory.mktemp("nb") / "run")


def test_the_fragment_is_scoped_and_scriptless(logdir: Path) -> None:
    cell = Report.load(logdir)._repr_html_()
    assert cell.startswith(f'<div class="{SCOPE}"><style>') and cell.endswith("</div>")
    style = re.search(r"<style>(.*?)</style>", cell, re.S).group(1)
    selectors = [s for rule in re.findall(r"([^{}]+)\{", style) for s in rule.split(",")]
    assert selectors and all(s.startswith(f".{SCOPE}") for s in selectors), selectors
    assert "<script" not in cell and "<body" not in cell and "<html" not in cell
    assert NASTY not in cell and "&lt;script&gt;" in cell


def test_scoping_limits_every_rule() -> None:
    assert scoped_css("body{a:1}\nh1,td.num{b:2}", "s") == ".s{a:1}.s h1,.s td.num{b:2}"


def test_a_profiler_with_nothing_recorded_says_so(tmp_path: Path) -> None:
    html = StepProfiler(tmp_path / "empty", schedule=None)._repr_html_()
    assert "nothing to show" in html and str(tmp_path / "empty") in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (installed by .ci/run)")
@pytest.mark.parametrize("source", ["report", "profiler"])
def test_chromium_renders_the_verdict_plot_and_findings_inline(logdir: Path, tmp_path: Path,
                                                              source: str) -> None:
    obj = Report.load(logdir) if source == "report" else StepProfiler(logdir, schedule=None)
    page = tmp_path / "notebook.html"
    page.write_text(NOTEBOOK.format(cell=obj._repr_html_()), encoding="utf-8")
    dom = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp_path / 'p'}",
                          "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    cell = re.search(rf'<div class="{SCOPE}">.*', dom, re.S)
    assert cell and "My notebook" in dom, dom[:2000]
    verdict = re.search(r'<div class="verdict" id="verdict" data-kind="([a-z_]+)"><h2>Verdict: ',
                        cell.group(0))
    assert verdict and verdict.group(1) == Report.load(logdir).verdict["kind"]
    plot = re.search(r'<svg id="step-time-plot".*?</svg>', cell.group(0), re.S)
    assert plot and len(re.findall(r'class="capture-window"', plot.group(0))) == 2
    assert 'data-kind="sync_point"' in cell.group(0) and "<script>alert" not in dom
