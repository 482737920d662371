"""Every generation of torch.profiler traces reads alike: torch 1.8-1.13 and 2.x, real and recorded."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset

from profcallbacks.report import build_report, locate_run, render_text
from profcallbacks.report.read.generations import OLD_CATEGORIES
from test_verdicts import HTA, trace_path

DATA = Path(__file__).parent / "data"
KINETO = DATA / "kineto-traces"
HTA_DATA = DATA / "hta-traces"
TO_OLD = {new: old for old, new in OLD_CATEGORIES.items()}


def report_of(path: Path) -> dict:
    return build_report(locate_run(path))


def rewrite(src: Path, dst: Path, categories: dict[str, str], *, string_ids: bool = False,
            step_cat: str | None = None) -> Path:
    """A copy of ``src`` with its categories renamed (and tids/pids as strings, as torch 1.x)."""
    with gzip.open(src, "rt") as f:
        trace = json.load(f)
    for event in trace["traceEvents"]:
        cat = event.get("cat")
        if cat in categories:
            event["cat"] = categories[cat]
        if step_cat and str(event.get("name", "")).startswith(("ProfilerStep#", "enumerate(")):
            if event.get("cat") in ("user_annotation", "cpu_op", "Operator"):
                event["cat"] = step_cat
        if string_ids:
            for key in ("tid", "pid"):
                if isinstance(event.get(key), int):
                    event[key] = str(event[key])
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt", compresslevel=1) as f:
        json.dump(trace, f)
    return dst


def file_entry(report: dict) -> dict:
    [capture] = report["captures"]
    [entry] = capture["files"]
    return entry


def test_real_torch_1_9_traces_get_the_verdicts_of_their_runs():
    # kineto's own samples: ResNet-50 on a V100 with num_workers=0 (the plugin's example of a
    # DataLoader-bound run) and with num_workers=4 (the GPU is then the bound)
    slow = report_of(KINETO / "resnet50_num_workers_0.pt.trace.json.gz")
    fed = report_of(KINETO / "resnet50_num_workers_4.pt.trace.json.gz")
    assert file_entry(slow)["trace_format"]["generation"] == "torch 1.8-1.13"
    assert slow["verdict"]["kind"] == "input_bound"
    assert 0.35 < slow["breakdown"]["data_wait_share"] < 0.45
    assert fed["verdict"]["kind"] == "gpu_compute_bound"
    assert fed["breakdown"]["data_wait_share"] < 0.02
    for report in (slow, fed):
        assert [c["steps"] for c in report["captures"]] == [[5, 6, 7]]
        names = [o["name"] for o in report["top_operators"]["cpu"]]
        assert "aten::cudnn_convolution" in names and report["top_operators"]["gpu"]
        assert not report["problems"]
        text = render_text(report)
        assert "no trace" not in text and "none (" not in text.split("\n")[0]


def test_an_old_trace_renamed_to_torch_2_reads_the_same(tmp_path):
    src = KINETO / "resnet50_num_workers_0.pt.trace.json.gz"
    modern = rewrite(src, tmp_path / "kineto-traces" / "w.pt.trace.json.gz", OLD_CATEGORIES,
                     step_cat="user_annotation")
    old, new = report_of(src), report_of(modern)
    assert file_entry(new)["trace_format"]["generation"] == "torch 2.x"
    assert old["verdict"] == new["verdict"]
    assert old["breakdown"] == new["breakdown"]
    assert old["top_operators"] == new["top_operators"]
    assert file_entry(old)["gpu_breakdown"] == file_entry(new)["gpu_breakdown"]


@pytest.mark.parametrize("stem", sorted(HTA))
def test_hta_breakdown_holds_on_the_old_format(tmp_path, stem):
    # HTA's real GPU traces written back in torch 1.x's vocabulary: categories renamed, step
    # ranges as Operator events, tids and pids as strings; the breakdown must stay HTA's
    src = trace_path(stem)
    old = rewrite(src, tmp_path / stem / f"{stem}.pt.trace.json.gz", TO_OLD, string_ids=True,
                  step_cat="Operator")
    modern, renamed = report_of(src), report_of(old)
    assert file_entry(renamed)["trace_format"]["generation"] == "torch 1.8-1.13"
    gb = file_entry(renamed)["gpu_breakdown"]
    idle, compute, non_compute, overlap = HTA[stem]
    assert gb["idle_share"] * 100 == pytest.approx(idle, abs=1.0)
    assert gb["compute_share"] * 100 == pytest.approx(compute, abs=1.0)
    assert gb["non_compute_share"] * 100 == pytest.approx(non_compute, abs=1.0)
    if overlap is not None:
        assert gb["comm_overlap_share"] * 100 == pytest.approx(overlap, abs=1.0)
    assert renamed["verdict"]["kind"] == modern["verdict"]["kind"]
    assert renamed["top_operators"] == modern["top_operators"]


def test_loader_recognised_as_user_annotation_in_a_real_foreign_trace():
    # HTA's CPU-only trace: its DataLoader __next__ is a user_annotation inside ProfilerStep#1009
    with gzip.open(HTA_DATA / "cpu_only_no_distributed_info.pt.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    [loader] = [e for e in events if e.get("name", "").startswith("enumerate(DataLoader)#")]
    assert loader["cat"] == "user_annotation"
    report = report_of(HTA_DATA / "cpu_only_no_distributed_info.pt.trace.json.gz")
    assert report["breakdown"]["data_wait_ms"] == pytest.approx(loader["dur"] / 1e3, rel=1e-6)
    assert file_entry(report)["trace_format"]["loader_ranges"] == 1


def test_lightning_loader_range_counts_as_data_wait(tmp_path):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
         "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "[_TrainingEpochLoop].train_dataloader_next",
         "pid": 1, "tid": 1, "ts": 10, "dur": 400},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 500, "dur": 300},
    ]}
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps(trace))
    report = report_of(path)
    assert report["breakdown"]["data_wait_ms"] == pytest.approx(0.4)
    assert report["breakdown"]["compute_ms"] == pytest.approx(0.3)


def test_categories_it_cannot_read_are_named_once(tmp_path):
    src = HTA_DATA / "cpu_only_no_distributed_info.pt.trace.json.gz"
    odd = rewrite(src, tmp_path / "odd" / "w.pt.trace.json.gz", {"cpu_op": "host_op"})
    report = report_of(odd)
    problems = [p["error"] for p in report["problems"]]
    assert len(problems) == 1
    assert problems[0].startswith("CPU operators not found: categories seen host_op (2424)")
    text = render_text(report)
    assert "could not be read" not in text.split("Files that")[0]
    assert "no trace could be read" not in text and "1 trace(s) read" in text
    assert report["verdict"] is None and text.splitlines()[3].startswith(
        "Verdict: none (1 trace(s) read")


class SlowDataset(Dataset):
    """Each sample takes ``delay_s`` to build (decode, augmentation ...)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay_s)
        return torch.full((64,), float(index))


def test_plain_torch_profiler_trace_of_a_slow_loader_reads_input_bound(tmp_path, one_thread):
    # a loop as users write it: torch.profiler and tensorboard_trace_handler, no profcallbacks
    loader = DataLoader(SlowDataset(0.003), batch_size=4)  # ~12 ms per batch
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waits: list[float] = []
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path / "tb"), use_gzip=True)) as prof:
        it = iter(loader)
        for step in range(5):
            t0 = time.perf_counter()
            batch = next(it)
            if step >= 2:
                waits.append(time.perf_counter() - t0)
            for _ in range(3):
                loss = model(batch).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            prof.step()
    [trace] = list((tmp_path / "tb").glob("*.pt.trace.json.gz"))
    with gzip.open(trace, "rt") as f:
        cats = {e.get("cat") for e in json.load(f)["traceEvents"]
                if str(e.get("name", "")).startswith("enumerate(DataLoader)#")}
    assert cats == {"user_annotation"}  # as torch 2.x writes it
    report = report_of(tmp_path / "tb")
    measured_ms = sum(waits) / len(waits) * 1e3
    assert report["verdict"]["kind"] == "input_bound", (report["verdict"], report["breakdown"],
                                                        measured_ms)
    assert report["breakdown"]["data_wait_ms"] == pytest.approx(measured_ms, rel=0.25)
    assert report["breakdown"]["compute_ms"] > 0


@pytest.mark.parametrize("path", sorted(HTA_DATA.glob("*.pt.trace.json.gz")) + sorted(
    KINETO.glob("*.pt.trace.json.gz")), ids=lambda p: p.name.split(".")[0])
def test_foreign_traces_report_what_they_hold_without_empty_sections(path):
    from profcallbacks.report.render.html import render_html

    report = report_of(path)
    assert report["foreign"] and report["verdict"] is not None
    text = render_text(report)
    for empty in ("wrote no steps file", "no traced steps", "no trace could be read", "Verdict: none"):
        assert empty not in text, empty
    assert "read from the traces alone" in text
    html = render_html(report)
    assert "No traced steps" not in html and "read from the traces alone" in html
