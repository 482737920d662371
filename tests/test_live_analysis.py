"""The live capture analysis is a callable the session hands to the exporter, checked at start."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from profcallbacks import ProfilerConfig, ProfilingSession
from profcallbacks.core.capture_info import CaptureInfo
from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.triggers import BASELINE
from profcallbacks.findings import CAPTURE_VERDICT
from profcallbacks.report.analyse.advice import without_advice
from profcallbacks.report.capture_findings import capture_findings
from profcallbacks.run.defaults import live_analysis

MODULE = "profcallbacks.report.capture_findings"


def test_a_session_without_its_live_analysis_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, MODULE, None)  # the import fails as a missing module does
    with pytest.raises(ImportError, match="live capture analysis cannot be imported") as caught:
        ProfilingSession(ProfilerConfig(schedule=None, tensorboard_scalars=False), tmp_path)
    assert MODULE in str(caught.value) and "reinstall profcallbacks" in str(caught.value)
    assert not (tmp_path / "profcallbacks").exists()  # refused before it wrote anything


def test_the_analysis_travels_to_the_export_helper_by_reference():
    """The helper process receives the callable in a pickled message: its module is imported
    there again (a lambda or a closure would not travel)."""
    assert live_analysis() is capture_findings
    assert pickle.loads(pickle.dumps(live_analysis())) is capture_findings


DATA = Path(__file__).parent / "data"


def live_verdict(trace: Path):
    """The live verdict of one recorded trace, as the export helper writes it after a capture."""
    info = CaptureInfo("cap", BASELINE, 0, (), False, 0, 0, RankInfo.detect())
    [verdict] = [f for f in capture_findings(trace, info, []) if f.kind == CAPTURE_VERDICT]
    return verdict


def test_a_fix_the_verdict_already_gives_is_said_once():
    """A capture that is mostly start-up: the verdict's advice and the top diagnosis's fix are
    the same sentence (it was said twice on one line)."""
    verdict = live_verdict(DATA / "gpu-traces" / "alexnet_critical_path.pt.trace.json.gz")
    assert verdict.details["diagnoses"][0]["kind"] == "cold_start"
    assert verdict.message.count("Schedule the capture past start-up") == 1
    assert "Top diagnosis: cold_start, up to" in verdict.message
    assert "Top diagnosis" not in without_advice(verdict.message)  # as the report lists it


def test_a_different_fix_of_the_top_diagnosis_follows_the_verdicts_advice():
    """num_workers=0 on a GPU job: the verdict's general advice (raise num_workers), then the
    diagnosis's own count of workers, both on the line."""
    verdict = live_verdict(DATA / "kineto-traces" / "resnet50_num_workers_0.pt.trace.json.gz")
    assert verdict.details["diagnoses"][0]["kind"] == "input_pipeline"
    advice, diagnosis = verdict.message.split("Try: ")[1].split("Top diagnosis: ")
    assert "Raise DataLoader num_workers" in advice
    assert diagnosis.startswith("input_pipeline, up to") and "DataLoader(num_workers=" in diagnosis
