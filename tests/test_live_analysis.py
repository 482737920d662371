"""The live capture analysis is a callable the session hands to the exporter, checked at start."""

from __future__ import annotations

import pickle
import sys

import pytest

from profcallbacks import ProfilerConfig, ProfilingSession
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
