"""Every front end takes the same options as StepProfiler (and ProfilerConfig)."""

import dataclasses
import importlib
import inspect

import pytest

from profcallbacks import ProfilerConfig, StepProfiler

FRONT_ENDS = [("profcallbacks.lightning", "ProfilerCallback"), ("profcallbacks.hf", "ProfilerCallback")]


def keyword_options(cls):
    """Name -> (annotation, default) of each keyword-only option."""
    return {name: (str(p.annotation), p.default)
            for name, p in inspect.signature(cls).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_step_profiler_covers_every_config_field():
    fields = {f.name for f in dataclasses.fields(ProfilerConfig)}
    assert fields <= set(keyword_options(StepProfiler))


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
