"""docs/explanation/architecture.md matches the code: every module it names exists, every module
of the package is named, and a step's path names functions that exist, in at most six hops."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "profcallbacks"
DOC = Path(__file__).parents[1] / "docs" / "explanation" / "architecture.md"
FOLDER = re.compile(r"^- `([\w/]+)/`")  # a Modules bullet: its bare names are in this folder
CODE = re.compile(r"`([^`]+)`")


def sections(text: str) -> dict[str, str]:
    """``## Title`` -> the section's text (the page's introduction under ``""``)."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {"": parts[0], **{parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}}


def named_modules(text: str) -> set[str]:
    """Module paths relative to the package (``run/session.py``) the page names: a path with
    its folders anywhere, a bare name inside a Modules bullet of a folder (``- `run/`: ...``),
    else a module at the top level (``loop.py``)."""
    named: set[str] = set()
    folder = ""
    for line in text.splitlines():
        match = FOLDER.match(line)
        if match:
            folder = "" if match.group(1) == "profcallbacks" else match.group(1)
        elif not line.startswith("  "):  # a bullet's continuation lines keep its folder
            folder = ""
        for token in CODE.findall(line):
            if not re.fullmatch(r"[\w/]+\.py", token) or token.startswith("tests/"):
                continue
            named.add(token if "/" in token else f"{folder}/{token}".lstrip("/"))
    return named


def package_modules() -> set[str]:
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_every_module_named_exists():
    missing = sorted(m for m in named_modules(DOC.read_text(encoding="utf-8"))
                     if not (PACKAGE / m).is_file())
    assert missing == []


def test_every_module_is_named():
    unnamed = sorted(package_modules() - named_modules(DOC.read_text(encoding="utf-8")))
    assert unnamed == []


def test_the_checks_see_a_missing_and_an_unnamed_module():
    text = "- `run/`: `session.py`, `gone.py`\n  `blocks.py`\n\n`loop.py` and `capture/planner.py`"
    assert named_modules(text) == {"run/session.py", "run/gone.py", "run/blocks.py", "loop.py",
                                   "capture/planner.py"}
    assert "run/dispatch.py" in package_modules() - named_modules(text)


def test_the_page_keeps_its_sections():
    assert {"A step's path", "Modules"} <= set(sections(DOC.read_text(encoding="utf-8")))


def test_a_steps_path_has_at_most_six_hops_and_names_functions_of_the_code():
    path = sections(DOC.read_text(encoding="utf-8"))["A step's path"]
    hops = re.findall(r"^\d+\. ", path, flags=re.MULTILINE)
    assert 1 <= len(hops) <= 6
    modules = [importlib.import_module("profcallbacks." + m[:-3].replace("/", "."))
               for m in sorted(named_modules(path))]
    names = [t for t in CODE.findall(path) if re.fullmatch(r"[A-Z]\w*(\.\w+)?", t)]
    assert "StepProfiler.step" in names and "FindingRouter.emit" in names
    unresolved = []
    for name in names:
        owner, _, attribute = name.partition(".")
        found = [getattr(m, owner) for m in modules if hasattr(m, owner)]
        if not any(not attribute or hasattr(o, attribute) for o in found):
            unresolved.append(name)
    assert unresolved == []
