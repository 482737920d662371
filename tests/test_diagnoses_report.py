"""Diagnoses and throughput in every report format, in compare, and MFU's denominators."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from profcallbacks.cli import main
from profcallbacks.report import build_report, locate_run, render_html, render_text
from profcallbacks.report.analyse.diagnoses.throughput import PEAK_TFLOPS, device_key
from profcallbacks.report.compare import ALL_OPERATORS, compare_reports, render_compare_text

DATA = Path(__file__).parent / "data" / "gpu-traces"
KINETO = Path(__file__).parent / "data" / "kineto-traces"
ROOT = Path(__file__).resolve().parent.parent
SHARED = next((p for p in (ROOT.parent / "shared" / "gpu-traces",
                           ROOT.parent.parent / "shared" / "gpu-traces") if p.is_dir()), None)


def run_of(tmp_path: Path, stem: str, folder: Path = DATA) -> Path:
    source = folder / f"{stem}.pt.trace.json.gz"
    if not source.is_file():
        pytest.skip(f"{source} is absent")
    target = tmp_path / stem
    target.mkdir()
    shutil.copy(source, target / source.name)
    return target


def test_alexnet_diagnoses_in_json_text_and_html(tmp_path):
    report = build_report(locate_run(run_of(tmp_path, "alexnet_critical_path")))
    assert report["schema_version"] == 3
    [capture] = report["captures"]
    kinds = [d["kind"] for d in capture["diagnoses"]]
    assert kinds == ["cold_start", "pageable_copy", "fp32_compute"]  # by gain
    assert [d["kind"] for d in report["diagnoses"]] == kinds
    first = capture["diagnoses"][0]
    assert set(first) >= {"kind", "what", "evidence", "where", "gain_ms", "gain_share", "fix"}
    assert first["seen_in"] == ["rank 0"] and report["diagnoses"][0]["seen_in"] == ["alexnet_critical_path"]
    text = render_text(report)
    verdict_at, diagnoses_at = text.index("Verdict: HOST_BOUND"), text.index("Diagnoses")
    assert text.index("profcallbacks report:") < verdict_at < diagnoses_at  # under the header
    assert "this capture is not steady state" in text and "pageable_copy: ~56.99 ms" in text
    page = render_html(report)
    assert "id=diagnoses" in page and 'data-kind="fp32_compute"' in page
    assert "id=throughput" in page and "no FLOPs in the trace" in page  # recorded without shapes


def test_compare_says_which_diagnoses_appeared_and_went(tmp_path):
    a = build_report(locate_run(run_of(tmp_path, "resnet50_num_workers_0", KINETO)), top=ALL_OPERATORS)
    b = build_report(locate_run(run_of(tmp_path, "resnet50_num_workers_4", KINETO)), top=ALL_OPERATORS)
    changes = compare_reports(a, b)["diagnoses"]
    assert [d["kind"] for d in changes["went"]] == ["input_pipeline"]
    assert [d["kind"] for d in changes["appeared"]] == ["pageable_copy"]
    # SGD per parameter in both, but with the GPU busy under the optimizer foreach saves nothing
    assert {d["kind"] for d in changes["changed"]} == {"fp32_compute"}
    text = render_compare_text(compare_reports(a, b))
    assert "input_pipeline: went" in text and "pageable_copy: appeared" in text


def test_mfu_of_a_known_gpu_shows_its_dense_peak(tmp_path):
    if SHARED is None:
        pytest.skip("../shared/gpu-traces is absent")
    report = build_report(locate_run(run_of(tmp_path, "memcpy_heavy_rank0", SHARED)))
    tp = report["captures"][0]["throughput"]
    # A100 running TF32 tensor-core GEMMs (cutlass_80_tensorop_s1688gemm): 156 TFLOP/s dense
    # (312 is the 2:4-sparsity figure)
    assert tp["device"] == "NVIDIA A100-SXM4-80GB" and tp["dtype"] == "tf32"
    assert tp["peak_tflops"] == 156.0 and "dense" in tp["peak_source"]
    assert tp["flops_source"] == "shapes" and tp["flops_per_step"] > 1e9
    assert tp["mfu"] == pytest.approx(tp["achieved_tflops"] / 156.0)
    assert "of 156 TFLOP/s (A100 dense tf32 datasheet peak)" in render_text(report)
    assert "of 156 TFLOP/s (A100 dense tf32 datasheet peak)" in render_html(report)


def test_no_mfu_without_device_and_an_override_for_it(tmp_path, capsys):
    # The sampled trace has shapes (its GEMMs give FLOPs) but no deviceProperties: no peak.
    run = run_of(tmp_path, "sampled_rank0")
    tp = build_report(locate_run(run))["captures"][0]["throughput"]
    assert tp["achieved_tflops"] > 0 and tp["device"] is None and tp["mfu"] is None
    assert main(["report", str(run), "--format", "json", "--peak-tflops", "312"]) == 0
    given = json.loads(capsys.readouterr().out)["captures"][0]["throughput"]
    assert given["peak_tflops"] == 312 and given["peak_source"] == "given"
    assert given["mfu"] == pytest.approx(given["achieved_tflops"] / 312)
    with pytest.raises(SystemExit):
        main(["report", str(run), "--peak-tflops", "-5"])
    assert "--peak-tflops must be a positive number" in capsys.readouterr().err


@pytest.mark.parametrize("name, key", [("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                       ("NVIDIA H100 PCIe", "H100 PCIe"),
                                       ("NVIDIA A100-PG509-200", "A100"), ("NVIDIA A10G", "A10"),
                                       ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
                                       ("Tesla V100-PCIE-16GB", "V100 PCIe"), ("Tesla T4", "T4"),
                                       ("AMD Instinct MI300X", "MI300X"),
                                       ("AMD Instinct MI210", "MI210"), ("NVIDIA B200", "B200"),
                                       ("NVIDIA GeForce RTX 2080 Ti", "RTX 2080 Ti"),
                                       ("Quadro GP100", "GP100"),
                                       ("AMD Instinct MI250X", None)])
def test_peak_table_rows(name, key):
    assert device_key(name) == key


def test_peaks_are_dense_not_sparse():
    # datasheet 2:4-sparsity figures are exactly twice the dense ones; these are the dense
    assert PEAK_TFLOPS["H100 SXM"]["bf16"] == 989.4 and PEAK_TFLOPS["A100"]["bf16"] == 312.0
    assert PEAK_TFLOPS["A100"]["tf32"] == 156.0 and PEAK_TFLOPS["L4"]["bf16"] == 121.0


def test_fixes_fit_the_runs_framework_and_loader():
    from profcallbacks.report.analyse.advice import RunContext
    from profcallbacks.report.analyse.expert import fit_to_run

    found = [{"kind": "unfused_optimizer", "evidence": [], "fix": ["torch.optim.AdamW(..., foreach=True)"]},
             {"kind": "input_pipeline", "evidence": ["data wait"], "fix": ["generic"]}]
    hf = fit_to_run(found, RunContext(device="cuda", framework="hf",
                                      loader={"num_workers": 0, "pin_memory": False}))
    assert hf[0]["fix"][0].startswith("TrainingArguments(optim='adamw_torch_fused')")
    assert hf[1]["evidence"][-1] == "the loader in use: num_workers=0, pin_memory=False"
    assert "num_workers=0" in hf[1]["fix"][0] and "pin_memory=True" in hf[1]["fix"][0]
    plain = fit_to_run(found, RunContext(device="cpu"))
    assert plain == found  # nothing known about the run: the trace's own fixes stay


def test_watch_shows_the_top_diagnoses_of_a_live_verdict(tmp_path):
    from rich.console import Console

    from profcallbacks.layout import META_DIR, capture_dir_name
    from profcallbacks.watch.state import LogdirState
    from profcallbacks.watch.view import render

    (tmp_path / META_DIR).mkdir()
    (tmp_path / capture_dir_name(5, "schedule")).mkdir()
    details = {"capture": "step000005-schedule", "kind": "input_bound", "share": 0.8,
               "evidence": [], "advice": [],
               "diagnoses": [{"kind": "input_pipeline", "gain_ms": 12.0},
                             {"kind": "pageable_copy", "gain_ms": 1.5}]}
    finding = {"kind": "capture_verdict", "step": 7, "rank": 0, "severity": "info",
               "message": "capture step000005-schedule: input_bound", "details": details}
    (tmp_path / META_DIR / "rank0.findings.jsonl").write_text(json.dumps(finding) + "\n")
    state = LogdirState(tmp_path)
    state.poll()
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(state))
    assert "input_pipeline (12.0 ms), pageable_copy (1.5 ms)" in console.export_text()


@pytest.mark.parametrize("kernel, dtype", [
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x128_MI16x16x1", "bf16"),  # MI300X
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8", "fp16"),
    ("Cijk_Ailk_Bljk_SS_MT64x64x16", "fp32"),
    ("sm90_xmma_gemm_e4m3f16_e4m3_f32_tn_n_tilesize128x128x128", "fp8"),
    ("void gemm_mxfp4_kernel<128>", "fp4"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "bf16"),
    ("volta_sgemm_128x64_nn", "fp32"),
])
def test_kernel_names_of_both_vendors_tell_the_dtype(kernel, dtype):
    from profcallbacks.report.analyse.diagnoses.precision import precision

    assert precision(kernel) == dtype


def test_mfu_of_an_amd_bf16_run_against_the_mi300x_peak():
    # rocBLAS/hipBLASLt GEMMs are Cijk_..._BBS_...: bf16, so the bf16 matrix-core peak applies
    # (before: no GEMM recognised, no dtype, no MFU)
    path = SHARED / "mi300x_resnet18_allocator.pt.trace.json.gz" if SHARED else None
    if path is None or not path.is_file():
        pytest.skip("../shared/gpu-traces is absent")
    tp = build_report(locate_run(path))["captures"][0]["throughput"]
    assert tp["dtype"] == "bf16" and tp["peak_tflops"] == 1307.4
    assert tp["peak_source"] == "MI300X dense bf16 datasheet peak" and 0 < tp["mfu"] < 0.05


def test_the_tf32_gain_scales_fp32_gemm_time_by_the_devices_peak_ratio():
    # AlexNet on an A100 (HTA's critical-path sample): its matmuls run FP32 sgemm kernels, 2.62 ms
    # a step; TF32 can at most run them at the A100's tf32/fp32 peak ratio, 156/19.5 = 8x, so the
    # fix saves 7/8 of them, not their whole time (the gain before: 2.62 ms)
    from profcallbacks.report.analyse.diagnoses.registry import diagnose
    from profcallbacks.report.model.flops import dtype_ratio
    from profcallbacks.report.read.traces import read_trace_file

    cap = read_trace_file(Path(__file__).parent / "data" / "gpu-traces" /
                          "alexnet_critical_path.pt.trace.json.gz").capture
    [d] = [d for d in diagnose(cap)[0] if d.kind == "fp32_compute"]
    assert d.details["dtype_ratio"] == 8.0
    assert d.gain_ms == pytest.approx(d.details["fp32_ms"] * 7 / 8, rel=1e-3)
    assert "A100 dense fp32 19.5 -> tf32 156 TFLOP/s" in d.details["basis"]
    assert "bf16 autocast: at most 16.0x (A100 dense fp32 19.5 -> bf16 312" in d.details["basis"]
    assert dtype_ratio("Tesla V100-SXM2-32GB", "fp32", "fp16") == (
        pytest.approx(125.0 / 15.7), "V100 SXM2 dense fp32 15.7 -> fp16 125 TFLOP/s (datasheet peaks)")
    assert dtype_ratio("Unknown GPU", "fp32", "tf32") is None
    assert dtype_ratio("NVIDIA A100", "fp32", "fp8") is None  # the A100 row has no fp8 peak


def test_kernels_of_overlapping_streams_count_once():
    # AlexNet on an A100: some kernels of its streams run at the same time; the share of the GPU's
    # time its FP32 GEMMs take is over the GPU's busy time (the union), not the kernels' summed
    # durations (0.2452 before, the overlap counted twice)
    from profcallbacks.report.analyse.diagnoses.registry import diagnose
    from profcallbacks.report.analyse.diagnoses.whatif import gpu_time
    from profcallbacks.report.read.traces import read_trace_file

    cap = read_trace_file(Path(__file__).parent / "data" / "gpu-traces" /
                          "alexnet_critical_path.pt.trace.json.gz").capture
    steady = [k for k in cap.kernels if k.cat == "kernel"
              and cap.in_steps(k.launch_ts if k.launch_ts is not None else k.ts)]
    assert gpu_time(steady) < sum(k.dur for k in steady)  # the streams overlap
    [d] = [d for d in diagnose(cap)[0] if d.kind == "fp32_compute"]
    share = d.details["fp32_ms"] * cap.n_steps * 1e3 / gpu_time(steady)
    assert d.details["gpu_share"] == pytest.approx(share, abs=2e-4)
    assert d.details["gpu_share"] > 0.2460
