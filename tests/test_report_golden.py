"""The report's JSON on every trace fixture equals its recorded golden file.

The goldens in ``tests/data/golden/`` were recorded from the reading as it stood before the reading
was laid out in stages; any change to a report must show here. To record them again after a change a
test justifies: ``PROFCALLBACKS_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from profcallbacks.report import build_report, locate_run

HERE = Path(__file__).parent
GOLDEN = HERE / "data" / "golden"
ROOT = HERE.resolve().parent
SHARED = next((p for p in (ROOT.parent / "shared" / "gpu-traces",
                           ROOT.parent.parent / "shared" / "gpu-traces") if p.is_dir()), None)
FIXTURES = sorted(HERE.glob("data/*-traces/*.pt.trace.json.gz"))
SHARED_FIXTURES = sorted(SHARED.glob("*.pt.trace.json.gz")) if SHARED else []
_UPDATE = os.environ.get("PROFCALLBACKS_UPDATE_GOLDEN") == "1"


def _name(source: Path) -> str:
    where = "shared" if SHARED is not None and source.parent == SHARED else source.parent.name
    return f"{where}--{source.name.removesuffix('.pt.trace.json.gz')}"


def report_json(source: Path, tmp_path: Path) -> Any:
    """The report of ``source`` alone in a directory, as the JSON round trip gives it."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(source, run / source.name)
    report = build_report(locate_run(run))
    text = json.dumps(report, sort_keys=True, allow_nan=False).replace(str(run), "<run>")
    result = json.loads(text)
    result["generator"] = "<generator>"  # the version string, not the reading
    return result


def differences(got: Any, want: Any, where: str = "$") -> list[str]:
    """Paths where ``got`` and ``want`` differ; floats equal to 1e-9 relative (summation order)."""
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(got, (int, float)) and isinstance(want, (int, float)) and \
                math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            return []
        return [f"{where}: {got!r} != {want!r}"]
    if type(got) is not type(want):
        return [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: unexpected" for k in got if k not in want]
        for k in want:
            if k in got:
                out += differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


@pytest.mark.parametrize("source", FIXTURES + SHARED_FIXTURES, ids=_name)
def test_report_json_equals_its_golden(source, tmp_path):
    golden = GOLDEN / f"{_name(source)}.json"
    got = report_json(source, tmp_path)
    if _UPDATE:
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert golden.is_file(), f"{golden} is missing: record it with PROFCALLBACKS_UPDATE_GOLDEN=1"
    diff = differences(got, json.loads(golden.read_text()))
    assert not diff, f"{len(diff)} differences from {golden.name}:\n" + "\n".join(diff[:40])


def test_the_comparison_sees_a_changed_value():
    want = {"a": [1, {"b": 0.5}], "c": "x"}
    assert differences({"a": [1, {"b": 0.5 + 1e-13}], "c": "x"}, want) == []
    assert differences({"a": [1, {"b": 0.51}], "c": "x"}, want) == ["$.a[1].b: 0.51 != 0.5"]
    assert differences({"a": [1, {"b": 0.5}]}, want) == ["$.c: missing"]
    assert differences({"a": [1], "c": "x"}, want) == ["$.a: 1 items != 2"]
