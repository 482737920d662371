"""Every front end takes the same options as StepProfiler (and ProfilerConfig)."""

import dataclasses
import importlib
import inspect
import re
import typing

import pytest

from profcallbacks import ProfilerConfig, StepProfiler
from profcallbacks.options.front_end import ProfilerOptions

FRONT_ENDS = [("profcallbacks.lightning", "ProfilerCallback"), ("profcallbacks.hf", "ProfilerCallback")]


def keyword_options(cls):
    """Name -> (annotation, default) of each keyword-only option."""
    return {name: (str(p.annotation), p.default)
            for name, p in inspect.signature(cls).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_step_profiler_covers_every_config_field():
    fields = {f.name for f in dataclasses.fields(ProfilerConfig)}
    assert fields <= set(keyword_options(StepProfiler))


def test_the_options_are_declared_once_in_config_order_with_config_defaults():
    """ProfilerOptions is the front ends' one declaration: ProfilerConfig's fields, in order,
    with its types (sync_audit also as a bool); each front end's signature shows them with
    ProfilerConfig's defaults, between logdir and its own keywords."""
    fields = dataclasses.fields(ProfilerConfig)
    hints = typing.get_type_hints(ProfilerOptions)
    config_hints = typing.get_type_hints(ProfilerConfig)
    assert list(hints) == [f.name for f in fields]
    for name, hint in hints.items():
        expected = config_hints[name] | bool if name == "sync_audit" else config_hints[name]
        assert hint == expected, name
    params = inspect.signature(StepProfiler).parameters
    assert list(params) == ["logdir", *hints, "on_finding", "metrics_sink"]
    for name in hints:
        assert params[name].default == getattr(ProfilerConfig(), name), name
        assert params[name].annotation == hints[name], name


def test_config_docstring_documents_every_option():
    """The options' documentation (the API reference's, generated from ProfilerConfig)."""
    doc = inspect.getdoc(ProfilerConfig)
    missing = [f.name for f in dataclasses.fields(ProfilerConfig)
               if not re.search(rf"^\s+{f.name}: \S", doc, re.MULTILINE)]
    assert missing == []


@pytest.mark.parametrize("module, name", [("profcallbacks", "StepProfiler"), *FRONT_ENDS])
def test_an_unknown_option_is_refused_naming_it(tmp_path, module, name):
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(TypeError, match=r"unknown option 'log_every_n_step'; the options are "
                                        r"schedule, trace, "):
        cls(tmp_path, log_every_n_step=5)


@pytest.mark.parametrize("module, name", FRONT_ENDS)
def test_adapters_take_the_same_options(module, name):
    try:
        cls = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{module} not built yet ({exc})")
    assert keyword_options(cls) == keyword_options(StepProfiler)


@pytest.mark.parametrize("module, name", [("profcallbacks", "StepProfiler"), *FRONT_ENDS])
@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_bad_capture_steps_rejected_at_the_call(tmp_path, module, name, steps):
    cls = getattr(importlib.import_module(module), name)
    front_end = cls(tmp_path)
    with pytest.raises(ValueError, match=rf"capture\(steps={steps!r}\): steps must be an int"):
        front_end.capture(steps=steps)
