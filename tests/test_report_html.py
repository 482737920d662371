"""`profcallbacks report --format html`: one offline page, escaped, rendered by headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from profcallbacks.cli import main
from report_runs import NASTY, plain_run

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p and Path(p).exists()), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    logdir = plain_run(tmp / "run")
    out = tmp / "report.html"
    assert main(["report", str(logdir), "--format", "html", "-o", str(out)]) == 0
    return out


def test_page_is_self_contained_and_escaped(page: Path) -> None:
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    # nothing that could fetch: no scripts, links, images, fonts, imports or URLs at all
    for pattern in (r"<script", r"<link", r"<img", r"<iframe", r"\bsrc=", r"\bhref=", r"url\(",
                    r"@import", r"@font-face", r"https?://", r"//[a-z0-9.-]+\.[a-z]{2,}/"):
        assert not re.search(pattern, html, re.IGNORECASE), pattern
    assert "default-src 'none'" in html  # and the browser is told to refuse any fetch
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;aten::item&gt;" in html  # details are escaped too
    assert NASTY not in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (installed by .ci/run)")
def test_chromium_renders_plot_and_findings(page: Path, tmp_path: Path) -> None:
    def chromium(*args: str) -> subprocess.CompletedProcess[str]:
        profile = tmp_path / f"profile{len(list(tmp_path.iterdir()))}"
        return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args,
                               page.as_uri()], capture_output=True, text=True, timeout=120)

    dom = chromium("--dump-dom").stdout
    svg = re.search(r'<svg id="step-time-plot".*?</svg>', dom, re.S)
    assert svg, dom[:2000]
    plot = svg.group(0)
    assert len(re.findall(r'class="capture-window"', plot)) == 2
    assert re.search(r'<polyline class="series" data-rank="0" points="[\d., ]{20,}"', plot)
    assert len(re.findall(r'class="traced-step"', plot)) == 5
    assert re.search(r'class="finding-marker" data-kind="sync_point"', plot)
    findings = re.search(r'<div id="findings">.*', dom, re.S)
    assert findings and 'data-kind="sync_point"' in findings.group(0)
    assert "&lt;script&gt;" in findings.group(0) and "<script>" not in dom  # shown as text, not run
    assert re.search(r'<div class="bar" id="breakdown"><div class="part-data_wait" style="width:[1-9]', dom)

    shot = tmp_path / "report.png"
    result = chromium("--window-size=1100,1400", f"--screenshot={shot}")
    assert shot.exists(), result.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
