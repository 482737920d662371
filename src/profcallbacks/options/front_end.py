"""The keyword options every front end takes, declared once.

``StepProfiler``, Lightning's and Hugging Face's ``ProfilerCallback`` take the same options:
:class:`ProfilerOptions` declares them for type checkers (``**options: Unpack[ProfilerOptions]``,
PEP 692), and :func:`takes_profiler_options` writes them into each front end's run-time
signature with their defaults (``help()``, IDEs, LightningCLI and the API reference see every
option by name). Their meaning is :class:`~profcallbacks.options.profiler.ProfilerConfig`'s
documentation, where they are validated together.

Example:
    >>> @takes_profiler_options
    ... def make(logdir: str, *, on_finding=None, **options: Unpack[ProfilerOptions]) -> None: ...
    >>> params = inspect.signature(make).parameters
    >>> list(params)[:3], params["max_captures"].default
    (['logdir', 'schedule', 'trace'], 10)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar, Unpack, get_type_hints

from profcallbacks.options.budget import ByteBudget
from profcallbacks.options.memory import MemoryConfig
from profcallbacks.options.profiler import DEFAULTS
from profcallbacks.options.schedule import Schedule
from profcallbacks.options.slowdown import SlowdownConfig
from profcallbacks.options.stall import StallConfig
from profcallbacks.options.sync_audit import SyncAuditConfig
from profcallbacks.options.trace import TraceOptions

__all__ = ["ProfilerOptions", "Unpack", "takes_profiler_options"]

F = TypeVar("F", bound=Callable[..., Any])


class ProfilerOptions(TypedDict, total=False):
    """Every option of :class:`~profcallbacks.options.profiler.ProfilerConfig`, as the front
    ends take it (``sync_audit`` also as a bool), in its order."""

    schedule: Schedule | None
    trace: TraceOptions
    max_captures: int
    capture_steps: int
    watch_capture_file: bool
    capture_file_poll_s: float
    log_every_n_steps: int | None
    tensorboard_scalars: bool
    capture_on_slowdown: bool
    ranks: tuple[int, ...] | None
    stall: StallConfig | None
    slowdown: SlowdownConfig | None
    sync_audit: SyncAuditConfig | bool | None
    capture_validation: bool
    memory: MemoryConfig | None
    baseline_capture: bool
    budget: ByteBudget | None
    tracker_captures: bool


def option_parameters() -> list[inspect.Parameter]:
    """Each option as a keyword-only parameter: its type, and its default from ``ProfilerConfig``."""
    hints = get_type_hints(ProfilerOptions)
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[name],
                              default=getattr(DEFAULTS, name)) for name in hints]


def takes_profiler_options(init: F) -> F:
    """Give ``init`` (which takes ``**options``) a signature that names every option.

    The options come after ``init``'s positional parameters and before its own keyword-only
    ones (``on_finding``, ``metrics_sink``).
    """
    signature = inspect.signature(init)
    params = list(signature.parameters.values())
    if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        raise TypeError(f"{init.__qualname__} must end with **options to take the profiler's options")
    own = params[:-1]
    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    init.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*positional, *option_parameters(), *keyword])
    return init
