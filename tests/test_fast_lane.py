"""The fast lane's lists in conftest.py name tests that exist: a renamed module or test would
otherwise fall silently into (or out of) the lane."""

import importlib
import importlib.util
from pathlib import Path

import conftest

ROOT = Path(__file__).parents[1]


def test_every_fast_module_exists():
    assert sorted(m for m in conftest.FAST_MODULES if not (ROOT / "tests" / m).is_file()) == []


def test_every_test_left_out_of_the_lane_exists():
    missing = []
    for node in sorted(conftest.NOT_FAST):
        path, _, name = node.partition("::")
        if path.startswith("src/"):  # a docstring example: profcallbacks.module.Object
            module, _, attribute = name.rpartition(".")
            try:
                found = hasattr(importlib.import_module(module), attribute) or \
                    importlib.util.find_spec(name) is not None
            except ImportError:
                found = importlib.util.find_spec(name) is not None
        else:
            spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            found = Path(path).name in conftest.FAST_MODULES and hasattr(module, name)
        if not found:
            missing.append(node)
    assert missing == []
