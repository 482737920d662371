"""What pyproject.toml declares as the oldest version of each dependency is what
scripts/test_oldest.sh installs (constraints/oldest.txt): a minimum moved in one is moved in the other."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with tomllib (Python 3.11+)")

ROOT = Path(__file__).parents[1]
PYPROJECT = ROOT / "pyproject.toml"
OLDEST = ROOT / "constraints" / "oldest.txt"
TOOLS = "[dev]"  # test, lint and docs tools: a bound is pinned only where the oldest run installs the tool


def lower_bounds(pyproject: str) -> dict[str, tuple[Version | None, str]]:
    """Package -> (its ``>=`` bound or ``None``, where it is declared), the tools' extra last."""
    project = tomllib.loads(pyproject)["project"]
    groups = {"dependencies": project["dependencies"],
              **{f"[{name}]": reqs for name, reqs in project["optional-dependencies"].items()}}
    bounds: dict[str, tuple[Version | None, str]] = {}
    for group in sorted(groups, key=lambda g: g == TOOLS):
        for text in groups[group]:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name != "profcallbacks":  # the `all` extra names the other extras
                minimum = next((Version(s.version) for s in req.specifier if s.operator == ">="), None)
                bounds.setdefault(name, (minimum, group))
    return bounds


def exact_pins(constraints: str) -> dict[str, Version]:
    """Package -> the version a constraints file pins with ``==`` (ranges such as ``numpy<2`` left out)."""
    pins = {}
    for line in constraints.splitlines():
        text = line.split(" #")[0].strip()
        if text and not text.startswith("#"):
            req = Requirement(text)
            pinned = [Version(s.version) for s in req.specifier if s.operator == "=="]
            if pinned:
                pins[canonicalize_name(req.name)] = pinned[0]
    return pins


def disagreements(pyproject: str, constraints: str) -> list[str]:
    pins = exact_pins(constraints)
    problems = []
    for name, (minimum, group) in sorted(lower_bounds(pyproject).items()):
        if minimum is None:
            if group != TOOLS:
                problems.append(f"{name} ({group}) has no lower bound: declare {name}>=OLDEST in "
                                f"pyproject.toml and pin {name}==OLDEST in {OLDEST.name}")
        elif name not in pins:
            if group != TOOLS:
                problems.append(f"{name}>={minimum} ({group}) is not pinned in {OLDEST.name}: "
                                f"add {name}=={minimum}")
        elif pins[name] != minimum:
            problems.append(f"{name}: pyproject.toml declares >={minimum} ({group}), {OLDEST.name} "
                            f"pins =={pins[name]}; make them the same")
    return problems


def test_the_oldest_run_installs_every_declared_minimum():
    assert disagreements(PYPROJECT.read_text(), OLDEST.read_text()) == []
    pins = exact_pins(OLDEST.read_text())
    assert pins["torch"] == Version("2.13.0") and pins["transformers"] == Version("4.40.0")


def test_a_moved_minimum_a_missing_pin_and_an_open_range_are_each_named():
    pyproject, oldest = PYPROJECT.read_text(), OLDEST.read_text()
    assert '"lightning>=2.1"' in pyproject and "\nrich==13.0.0\n" in oldest
    assert disagreements(pyproject.replace('"lightning>=2.1"', '"lightning>=2.2"'), oldest) == [
        "lightning: pyproject.toml declares >=2.2 ([lightning]), oldest.txt pins ==2.1.0; make them the same"]
    assert disagreements(pyproject, oldest.replace("\nrich==13.0.0\n", "\n")) == [
        "rich>=13 (dependencies) is not pinned in oldest.txt: add rich==13"]
    assert disagreements(pyproject.replace('"wandb>=0.17"', '"wandb"'), oldest) == [
        "wandb ([wandb]) has no lower bound: declare wandb>=OLDEST in pyproject.toml and pin "
        "wandb==OLDEST in oldest.txt"]
    # a tool of the dev extra is checked where the oldest run pins it, and only there
    assert disagreements(pyproject.replace('"pytest>=8"', '"pytest>=8.1"'), oldest) == [
        "pytest: pyproject.toml declares >=8.1 ([dev]), oldest.txt pins ==8.0.0; make them the same"]
    assert disagreements(pyproject.replace('"ruff>=0.5"', '"ruff>=0.6"'), oldest) == []


def test_ci_runs_the_oldest_versions_before_the_main_suite():
    steps = [line.split()[0] for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.startswith("scripts/")]
    assert steps.index("scripts/test_oldest.sh") < steps.index("scripts/test.sh")
    assert str(OLDEST.relative_to(ROOT)) in (ROOT / "scripts" / "test_oldest.sh").read_text()
