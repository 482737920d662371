"""The HTML report as a browser lays it out (headless Chromium): no table wider than the page, and
a stall's band over the steps its finding names, measured in the DOM and seen in a screenshot."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from profcallbacks import Schedule, StallConfig, StepProfiler
from profcallbacks.cli import main
from test_report_html import CHROMIUM, FLAGS

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (installed by .ci/run)")]
WINDOW = (1100, 1600)
STEPS = 60
MEASURE = """<script>
const body = document.body.getBoundingClientRect();
const svg = document.getElementById('step-time-plot');
const out = {body_right: body.right, page_width: document.documentElement.scrollWidth,
  window_width: window.innerWidth,
  tables: [...document.querySelectorAll('table')].map(t => {
    const r = t.getBoundingClientRect();
    return {id: t.previousElementSibling ? t.previousElementSibling.textContent : '',
            left: r.left, right: r.right};}),
  svg: svg ? (({left, top, width, height}) => ({left, top, width, height}))(
    svg.getBoundingClientRect()) : null,
  viewbox_width: svg ? svg.viewBox.baseVal.width : null};
document.body.insertAdjacentHTML('beforeend',
  '<pre id="measured">' + JSON.stringify(out) + '</pre>');
</script>"""


class SlowDataset(Dataset):
    """Samples that each take 3 ms to load: the loop waits for data from its first step on."""

    def __len__(self) -> int:
        return 4 * STEPS

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.003)
        return torch.randn(16)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The HTML report of a real loop whose stall is alerted early and never clears, with the
    diagnoses of a loader on the training thread and an optimizer stepped tensor by tensor."""
    tmp = tmp_path_factory.mktemp("layout")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(12):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    prof = StepProfiler(tmp / "run", schedule=Schedule(skip_first=30, warmup=1, active=3),
                        max_captures=1, tensorboard_scalars=False, watch_capture_file=False,
                        slowdown=None, sync_audit=False, memory=None,
                        stall=StallConfig(min_duration_s=0.1, min_steps=8, window=8,
                                          block_steps=2))
    with prof:
        for x in prof.wrap(DataLoader(SlowDataset(), batch_size=4)):
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    page = tmp / "report.html"
    assert main(["report", str(tmp / "run"), "--format", "html", "-o", str(page)]) == 0
    assert main(["report", str(tmp / "run"), "--format", "json", "-o", str(tmp / "r.json")]) == 0
    return page, json.loads((tmp / "r.json").read_text())


def _chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile{len(list(tmp_path.iterdir()))}"
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars",
                           "--run-all-compositor-stages-before-draw",
                           "--virtual-time-budget=3000", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def _measured(page: Path, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The layout of ``page`` (a copy with the measuring script, its fetch policy left out)."""
    html = page.read_text(encoding="utf-8")
    html = re.sub(r'<meta http-equiv="?Content-Security-Policy[^>]*>', "", html)
    copy = tmp_path / "measured.html"
    copy.write_text(html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = _chromium(copy, tmp_path, "--dump-dom").stdout
    found = re.findall(r'<pre id="measured">(\{.*?)</pre>', dom, re.S)  # not the script's own
    assert found, dom[-2000:]
    return json.loads(found[-1].replace("&amp;", "&")), dom


def _stall(report: dict[str, Any]) -> dict[str, Any]:
    [stall] = [f for f in report["findings"] if f["kind"] == "dataloader_stall"]
    return stall


def test_no_table_is_wider_than_the_page(report_page: tuple[Path, dict[str, Any]],
                                         tmp_path: Path) -> None:
    page, report = report_page
    assert report["diagnoses"], "the run has no diagnoses to lay out"
    layout, _ = _measured(page, tmp_path)
    assert layout["page_width"] <= layout["window_width"]  # nothing scrolls sideways
    assert layout["tables"]
    for table in layout["tables"]:
        assert table["right"] <= layout["body_right"] + 1, table


def _step_x(dom: str, report: dict[str, Any]) -> Any:
    """The plot's x of a step's start, from the capture window's band (its steps' extent)."""
    [capture] = report["captures"]
    a, width = map(float, re.search(r'<rect class="capture-window" x="([\d.]+)" y="[\d.]+" '
                                    r'width="([\d.]+)"', dom).groups())
    per_step = width / len(capture["steps"])
    return lambda step: a + (step - capture["steps"][0]) * per_step


def test_the_stall_band_covers_the_steps_its_finding_names(
        report_page: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    page, report = report_page
    stall = _stall(report)
    first, last = stall["details"]["first_step"], stall["details"]["last_step"]
    assert last < STEPS - 10  # alerted early; the run went on (never cleared)
    _, dom = _measured(page, tmp_path)
    [band] = re.findall(r'<rect class="finding-span" data-kind="dataloader_stall"[^>]*>', dom)
    x_of = _step_x(dom, report)
    x = float(re.search(r' x="([\d.]+)"', band).group(1))
    w = float(re.search(r' width="([\d.]+)"', band).group(1))
    assert x == pytest.approx(x_of(first), abs=1.0)
    assert x + w == pytest.approx(x_of(last + 1), abs=1.0)


def test_a_screenshot_shows_the_band_over_its_steps_only(
        report_page: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from PIL import Image

    page, report = report_page
    stall = _stall(report)
    first, last = stall["details"]["first_step"], stall["details"]["last_step"]
    layout, dom = _measured(page, tmp_path)
    shot = tmp_path / "report.png"
    result = _chromium(page, tmp_path, f"--screenshot={shot}")
    assert shot.exists(), result.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    band = re.search(r'<rect class="finding-span" data-kind="dataloader_stall" x="[\d.]+" '
                     r'y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', dom)
    assert band, "no stall band in the plot"
    y, h = map(float, band.groups())
    x_of = _step_x(dom, report)
    scale = layout["svg"]["width"] / layout["viewbox_width"]
    left, top = layout["svg"]["left"], layout["svg"]["top"]
    row = round(top + (y + h / 2) * scale)

    def coloured(step: float) -> bool:  # the band's colour over white, not white or grey
        r, g, b = image.getpixel((round(left + x_of(step) * scale), row))
        return max(r, g, b) - min(r, g, b) > 60

    span = last + 1 - first
    assert all(coloured(first + span * f) for f in (0.2, 0.5, 0.8)), "no band over its steps"
    capture_start = report["captures"][0]["steps"][0]
    after = [last + 1.5 + (capture_start - last - 2) * f for f in (0.0, 0.5, 1.0)]
    assert not any(coloured(step) for step in after), f"the band goes on past step {last}"
