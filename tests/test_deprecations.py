"""Names renamed since the last release keep working for one minor release, with a
DeprecationWarning that names the new name (docs/explanation/versioning.md)."""

import warnings

import pytest

from profcallbacks.core.timing import StepRecord


def test_step_record_captured_reads_excluded_and_warns():
    record = StepRecord(7, 0.02, 0.001, excluded=True)
    with pytest.warns(DeprecationWarning, match=r"StepRecord\.excluded"):
        assert record.captured is True
    with pytest.warns(DeprecationWarning):
        assert StepRecord(8, 0.02, 0.001).captured is False


def test_step_record_excluded_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert StepRecord(7, 0.02, 0.001, excluded=True).excluded
