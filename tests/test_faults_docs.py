"""Every test the fault pages name exists: a promise never points at a test that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "explanation" / "faults.md"]
_TOKEN = re.compile(r"`([^`]+)`")


def named_tests(page: Path) -> list[tuple[str, str | None]]:
    """``(file, test)`` for each test a page's tables name (``test`` None: the whole file).

    A cell names ``tests/x.py::test_y`` or ``tests/x.py``; a bare ``test_z`` after them is in
    the same file, and so is one in a table whose header names the file."""
    out: list[tuple[str, str | None]] = []
    default: str | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            default = None
            continue
        cells = line.strip("|").split("|")
        if set(line) <= set("|- "):
            continue
        header = [t for t in _TOKEN.findall(cells[-1]) if t.startswith("tests/")]
        if "Test" in cells[-1] and not re.search(r"`test_", cells[-1]):
            default = header[0] if header else None
            continue
        current = default
        for token in _TOKEN.findall(cells[-1]):
            if token.startswith("tests/"):
                current, _, test = token.partition("::")
                out.append((current, test or None))
            elif re.fullmatch(r"test_\w+", token) and current is not None:
                out.append((current, token))
    return out


def test_the_pages_name_tests() -> None:
    names = [n for page in PAGES for n in named_tests(page)]
    assert len(names) > 30
    assert ("tests/test_faults_threads.py",
            "test_two_threads_stepping_at_once_neither_crash_nor_corrupt") in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_test_exists(page: Path) -> None:
    missing = []
    for file, test in named_tests(page):
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
            continue
        if test is not None:
            defined = {node.name for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, ast.FunctionDef)}
            if test not in defined:
                missing.append(f"{file}::{test}")
    assert missing == [], f"{page.name} names tests that do not exist: {missing}"
