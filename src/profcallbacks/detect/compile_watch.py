"""torch.compile made visible: recompiles, fallbacks to eager and graph breaks as findings.

Where the events come from (torch 2.13, measured): dynamo calls ``torch._dynamo.callback``'s
start/end callbacks around each compile (forward, and the backward compiled lazily in the first
backward) and nowhere else, so nothing here runs while nothing compiles. What was compiled and why
comes afterwards from ``torch._dynamo.utils.get_compilation_metrics()`` (dynamo keeps the last 64
records: function, ``file:line``, the failed guard in ``recompile_reason``, the call stack, the
duration), read once per block and only after a compile. Two things are only in dynamo's logs:
the ``hit config.recompile_limit`` warning (a plain ``logging`` warning, to which a handler is
added) and the line of a graph break (the ``graph_breaks`` artifact logger, enabled for this
handler only, never printed). ``TORCH_TRACE``'s structured log has all of it but computes every
graph and generated source as text at each compile.

Older torch: a missing API turns its part off with one info line (no callbacks: no compile time
and no step exclusion; no metrics: no recompile reasons).
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from profcallbacks.detect.compile_reasons import (
    GraphBreak,
    LimitHit,
    call_site,
    describe_guard,
    first_reason,
    graph_break,
    guard_change,
    is_decorator,
    limit_hit,
    qualified_name,
    resumed_function,
)
from profcallbacks.detect.frames import CallerFrames
from profcallbacks.findings import (
    COMPILE_FALLBACK,
    DATALOADER_STALL,
    GRAPH_BREAK,
    RECOMPILE,
    STEP_SLOWDOWN,
    Finding,
)
from profcallbacks.options.sync_audit import LIBRARIES

log = logging.getLogger(__name__)

StepNow = Callable[[], "int | None"]
"""The step in progress, or ``None`` between steps (paused, not open)."""
_LIMIT_LOGGER = "torch._dynamo.convert_frame"
EXPLAINED_KINDS = (STEP_SLOWDOWN, DATALOADER_STALL)
FALLBACK_FIX = ("mark the changing dimension dynamic (torch._dynamo.mark_dynamic(x, dim) or "
                "torch.compile(..., dynamic=True)), pad or bucket the inputs to a few sizes, or "
                "raise torch._dynamo.config.recompile_limit")


class CompileWatcher:
    """Collects dynamo's compile events of one run and turns them into findings.

    Args:
        rank: Global rank written into the findings.
        step_now: Returns the step in progress (``None`` between steps); called only while a
            compile starts or dynamo logs.

    Example:
        >>> watcher = CompileWatcher(rank=0, step_now=lambda: 3)
        >>> watcher.install()  # doctest: +SKIP
        >>> watcher.pending, watcher.drain(), watcher.take_times(10)
        (False, [], {})
    """

    def __init__(self, *, rank: int, step_now: StepNow) -> None:
        self.rank = rank
        self.pending = False  # something compiled or was logged since the last drain
        self.poll = False  # no compile callbacks: look for new compilation metrics each block
        self.total_s = 0.0  # compile time of the run so far, between steps too
        self._step_now = step_now
        self._times: dict[int, float] = {}  # step (-1: between steps) -> seconds compiling
        self._started_at: float | None = None
        self._start_step: int | None = None
        self._last_step: int | None = None
        self._step_of_id: dict[str, int | None] = {}
        self._metrics: Callable[[], list[Any]] | None = None
        self._last_metric: Any = None
        self._limits: list[tuple[int | None, LimitHit]] = []
        self._breaks: list[tuple[int | None, GraphBreak]] = []
        self._sites: dict[tuple[str | None, int | None], int] = {}  # graph-break site -> hits
        self._recompiles: dict[str, int] = {}
        self._fallen_back: set[str] = set()
        self._events: list[dict[str, Any]] = []  # recompiles and fallbacks, for explain()
        self._handler = _DynamoLogHandler(self)
        self._loggers: list[tuple[logging.Logger, int, bool]] = []
        self._callbacks: Any = None
        self._frames: CallerFrames | None = None  # whose code a file is (set by install)

    def install(self) -> bool:
        """Listen to dynamo; ``False`` (and nothing installed) when torch.compile is not in use."""
        if "torch._dynamo" not in sys.modules:
            return False
        self._frames = CallerFrames(LIBRARIES)
        try:
            from torch._dynamo import callback

            handler = callback.callback_handler
            handler.register_start_callback(self._started)
            handler.register_end_callback(self._ended)
            self._callbacks = handler
        except (ImportError, AttributeError):
            log.info("profcallbacks: this torch has no compile callbacks (torch._dynamo.callback); "
                     "compile time per step is not measured and compiling steps stay in the "
                     "statistics (torch >= 2.6 has them).")
        try:
            from torch._dynamo.utils import get_compilation_metrics

            self._metrics = get_compilation_metrics
            known = get_compilation_metrics()
            self._last_metric = known[-1] if known else None  # compiles before the run: not ours
            self.poll = self._callbacks is None
        except (ImportError, AttributeError):
            log.info("profcallbacks: this torch keeps no compilation metrics "
                     "(torch._dynamo.utils.get_compilation_metrics); recompiles are not reported.")
        self._listen(logging.getLogger(_LIMIT_LOGGER), enable=False)
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith("torch._dynamo") and name.endswith(".__graph_breaks"):
                self._listen(logging.getLogger(name), enable=True)
        return True

    def _listen(self, logger: logging.Logger, *, enable: bool) -> None:
        self._loggers.append((logger, logger.level, logger.propagate))
        if enable and not logger.isEnabledFor(logging.DEBUG):  # the user's TORCH_LOGS stays
            logger.setLevel(logging.DEBUG)
            logger.propagate = False  # for this handler only: nothing printed
        logger.addHandler(self._handler)

    def uninstall(self) -> None:
        """Stop listening; dynamo's loggers get their levels back. Never raises."""
        if self._callbacks is not None:
            for remove, callback in ((self._callbacks.remove_start_callback, self._started),
                                     (self._callbacks.remove_end_callback, self._ended)):
                try:
                    remove(callback)
                except ValueError:
                    pass
            self._callbacks = None
        for logger, level, propagate in self._loggers:
            logger.removeHandler(self._handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._loggers = []

    # dynamo's callbacks (on the compiling thread; they must never raise into the compile)
    def _started(self, *args: Any) -> None:
        try:
            step = self._step_now()
            self._started_at, self._start_step, self.pending = time.perf_counter(), step, True
            self._last_step = step
            compile_id = getattr(args[0], "compile_id", None) if args else None
            if compile_id is not None:
                self._step_of_id.setdefault(str(compile_id), step)
        except Exception:  # never into dynamo
            pass

    def _ended(self, *_: Any) -> None:
        started, step = self._started_at, self._start_step
        if started is None:
            return
        seconds = time.perf_counter() - started
        self._started_at = None
        self.total_s += seconds
        key = -1 if step is None else step  # between steps: counted, no step excluded
        self._times[key] = self._times.get(key, 0.0) + seconds

    def logged(self, message: str) -> None:
        """A dynamo log line arrived: a recompile limit hit or a graph break."""
        hit = limit_hit(message) if "hit config." in message else None
        if hit is not None:
            self._limits.append((self._step_now(), hit))
            self.pending = True
            return
        found = graph_break(message)
        if found is not None:
            self._breaks.append((self._step_now(), found))
            self.pending = True

    def take_times(self, end_step: int) -> dict[int, float]:
        """Compile seconds of the steps before ``end_step``, each handed out once."""
        if not self._times:
            return {}
        taken = {step: s for step, s in self._times.items() if step < end_step}
        for step in taken:
            del self._times[step]
        return taken

    def segments(self, first: int, n: int, excluded: bool) -> list[tuple[int, int, bool, float]]:
        """The block of ``n`` steps from ``first`` as parts handed over one by one
        (:func:`compile_segments`), the compile seconds of its steps taken out."""
        compiled = self.take_times(first + n)
        return compile_segments(first, n, excluded, compiled) if compiled else [(0, n, excluded, 0.0)]

    def drain(self) -> list[Finding]:
        """Findings about what compiled since the last drain, in step order."""
        self.pending = False
        metrics = self._new_metrics()
        backward: dict[str, float] = {}  # the backward compiled lazily, by compile id
        for metric in metrics:
            if getattr(metric, "is_forward", None) is False:
                key = str(getattr(metric, "compile_id", None))
                backward[key] = backward.get(key, 0.0) + _seconds(metric)
        found = self._through_decorators(
            [f for metric in metrics for f in self._from_metric(metric, backward)])
        limits, self._limits = self._limits, []
        found += [self._fallback(step, hit) for step, hit in limits]
        breaks, self._breaks = self._breaks, []
        for step, site in breaks:
            finding = self._graph_break(step, site)
            if finding is not None:
                found.append(finding)
        found.sort(key=lambda f: f.step)
        return found

    def _new_metrics(self) -> list[Any]:
        if self._metrics is None:
            return []
        try:
            records = self._metrics()
        except Exception:
            return []
        last = self._last_metric
        new = records
        for k in range(len(records) - 1, -1, -1):
            if records[k] is last:
                new = records[k + 1:]
                break
        if records:
            self._last_metric = records[-1]
        return new

    def _step_of(self, metric: Any) -> int | None:
        compile_id = getattr(metric, "compile_id", None)
        if compile_id is not None and str(compile_id) in self._step_of_id:
            return self._step_of_id[str(compile_id)]
        return self._last_step if self._last_step is not None else self._step_now()

    def _from_metric(self, metric: Any, backward: dict[str, float]) -> list[Finding]:
        reason, name = getattr(metric, "recompile_reason", None), getattr(metric, "co_name", None)
        if not reason or not name or getattr(metric, "fail_type", None):
            return []  # a first compile, a backward, or a failure (the limit: its warning)
        step = self._step_of(metric)
        function, break_line = resumed_function(name)
        file, line = getattr(metric, "co_filename", None), getattr(metric, "co_firstlineno", None)
        key = f"{file}:{line}:{name}"
        count = self._recompiles[key] = self._recompiles.get(key, 0) + 1
        seconds = _seconds(metric) + backward.get(str(getattr(metric, "compile_id", None)), 0.0)
        called = call_site(getattr(metric, "stack_trace", None), self._user_code)
        change = guard_change(reason)
        decorator = not self._user_code(file or "") and is_decorator(file, line)
        label = f"{qualified_name(file, line, function)}()" + (
            f" after its graph break at line {break_line}" if break_line is not None else "")
        if self._frames is not None and self._frames.torch_code(file):  # a compiled DDP's wrapper
            label = f"the compiled module (torch's {function}())"
        where = f" at {called[0]}:{called[1]}" if called else ""
        between = step is None
        text = (f"{'between steps' if between else f'step {step}'} recompiled {label} "
                f"({_short(file)}:{line}) because {describe_guard(reason)}: {seconds:.1f} s; "
                f"recompile {count} of it{where}")
        event = {"kind": RECOMPILE, "step": step, "function": function, "compile_s": seconds,
                 "text": text}
        self._events.append(event)
        details = {"function": function, "file": file, "line": line, "decorator": decorator,
                   "call_file": called[0] if called else None,
                   "call_line": called[1] if called else None,
                   "guard": first_reason(reason), "recompiles": count,
                   "cache_entries": getattr(metric, "cache_size", None),
                   "compile_s": round(seconds, 4), "between_steps": between}
        if change is not None:
            details.update(changed=change.what, old=change.old, new=change.new)
        if break_line is not None:
            details["after_graph_break_line"] = break_line
        return [Finding(RECOMPILE, step=step if step is not None else self._after_last(),
                        rank=self.rank, severity="info" if between else "warning",
                        message=text + "; steps that compile are left out of the step statistics",
                        details=details)]

    def _through_decorators(self, found: list[Finding]) -> list[Finding]:
        """A library decorator's pass-through (transformers' ``wrapper()``) recompiled with the
        function it wraps, at the same step, is named in that function's finding: the
        recompile is the model's ``forward``'s, not the decorator's."""
        kept: list[Finding] = []
        folded: dict[int, list[Finding]] = {}
        for finding in found:
            target = None
            if finding.kind == RECOMPILE and finding.details.get("decorator"):
                target = next((f for f in found if f.kind == RECOMPILE and f.step == finding.step
                               and not f.details.get("decorator")), None)
            if target is None:
                kept.append(finding)
            else:
                folded.setdefault(id(target), []).append(finding)
        if not folded:
            return found
        dropped = {id(f) for group in folded.values() for f in group}
        texts = {f.message.split("; steps that compile")[0] for f in found if id(f) in dropped}
        self._events = [e for e in self._events if e.get("text") not in texts]
        out = []
        for finding in kept:
            group = folded.get(id(finding))
            if group:
                through = [f"{f.details['function']}() ({_short(f.details['file'])}:"
                           f"{f.details['line']})" for f in group]
                extra = sum(f.details["compile_s"] for f in group)
                details = {**finding.details, "through": through,
                           "compile_s": round(finding.details["compile_s"] + extra, 4)}
                finding = replace(finding, details=details, message=finding.message.replace(
                    "; steps that compile", f"; with its decorators {', '.join(through)} "
                    f"(+{extra:.1f} s); steps that compile", 1))
            out.append(finding)
        return out

    def _after_last(self) -> int:
        if self._last_step is not None:
            return self._last_step
        now = self._step_now()
        return now if now is not None else 0

    def _fallback(self, step: int | None, hit: LimitHit) -> Finding:
        function = hit.function or "a compiled function"
        self._fallen_back.add(function)
        where = f" ({_short(hit.file)}:{hit.line})" if hit.file else ""
        why = f"; the last guard that failed: {describe_guard(hit.last_reason)}" \
            if hit.last_reason else ""
        text = (f"{function}(){where} hit torch._dynamo.config.{hit.limit} ({hit.value}) and runs "
                f"eagerly for new inputs from step {step if step is not None else '?'} on{why}")
        self._events.append({"kind": COMPILE_FALLBACK, "step": step, "function": function,
                             "compile_s": 0.0, "text": text})
        details = {"function": hit.function, "file": hit.file, "line": hit.line,
                   "limit": hit.limit, "limit_value": hit.value, "last_guard": hit.last_reason,
                   "fix": FALLBACK_FIX}
        return Finding(COMPILE_FALLBACK, step=step if step is not None else self._after_last(),
                       rank=self.rank, severity="warning",
                       message=f"{text}. To fix it: {FALLBACK_FIX}", details=details)

    def _graph_break(self, step: int | None, site: GraphBreak) -> Finding | None:
        if self._frames is not None and self._frames.torch_code(site.file):
            return None  # in torch's own code (DistributedDataParallel's forward): not the user's
        key = (site.file, site.line)
        self._sites[key] = self._sites.get(key, 0) + 1
        if self._sites[key] > 1:
            return None  # one finding per place
        per_step = len(self._sites)
        hint = f" ({site.hint})" if site.hint else ""
        where = f"{_short(site.file)}:{site.line}"
        details: dict[str, Any] = {"file": site.file, "line": site.line, "reason": site.reason,
                                   "hint": site.hint, "breaks_per_step": per_step}
        caller = self._library_caller(site)
        if caller is not None:  # inside a library: the user's line that called into it
            details["call_file"], details["call_line"], library = caller
            where = f"{_short(caller[0])}:{caller[1]} (inside {library} at {where})"
        text = (f"graph break at {where}: {site.reason}{hint}; the compiled graph is split there "
                f"and the code around it runs eagerly "
                f"({per_step} graph break{'s' if per_step != 1 else ''} per step so far)")
        return Finding(GRAPH_BREAK, step=step if step is not None else self._after_last(),
                       rank=self.rank, severity="info", message=text, details=details)

    def _library_caller(self, site: GraphBreak) -> tuple[str, int, str] | None:
        """The innermost user frame of the break's traceback and the library's name when the
        break itself is in a library's code (``rank_zero_info`` in a ``forward``), else ``None``."""
        library = None if self._frames is None or site.file is None else self._frames.kind(site.file)
        if not library or self._frames is None:
            return None
        frames = self._frames
        return next(((f, n, library) for f, n in reversed(site.stack) if frames.is_user(f)), None)

    def _user_code(self, path: str) -> bool:
        return self._frames is None or self._frames.is_user(path)

    def explain(self, finding: Finding) -> Finding:
        """A slowdown or stall that coincides with recompiles or a fallback says so."""
        if finding.kind not in EXPLAINED_KINDS or not self._events:
            return finding
        details = finding.details
        first = details.get("first_slow_step", details.get("first_step", finding.step))
        if not isinstance(first, int):
            return finding
        margin = max(10, finding.step - first)
        near = [e for e in self._events
                if e["step"] is not None and first - margin <= e["step"] <= finding.step]
        if not near:
            return finding
        costly = max(near, key=lambda e: e["compile_s"])
        fallback = next((e for e in near if e["kind"] == COMPILE_FALLBACK), None)
        said = [fallback["text"]] if fallback else []
        if costly is not fallback:
            said.append(costly["text"])
        recompiles = [e for e in near if e["kind"] == RECOMPILE]
        if len(recompiles) > 1:
            said.append(f"{len(recompiles)} recompiles in all "
                        f"({sum(e['compile_s'] for e in recompiles):.1f} s)")
        return replace(finding, message=f"{finding.message}; it coincides with torch.compile "
                                        f"events: {'; '.join(said)}",
                       details={**details, "compile_events": [
                           {k: v for k, v in e.items() if k != "text"} for e in near]})


def watch_compile(*, rank: int, step_now: Callable[[], int | None]) -> CompileWatcher | None:
    """A watcher listening to torch.compile's events, ``None`` while ``torch._dynamo`` is not
    imported (no compile yet). One that fails to install is a watcher that hears nothing (its
    events are off, with one warning): training goes on.

    ``step_now`` is held weakly when it is a bound method: torch's compile callbacks are global,
    and an owner abandoned open must still be collected (and close itself).
    """
    if hasattr(step_now, "__self__"):
        ref = weakref.WeakMethod(step_now)

        def step_now() -> int | None:
            method = ref()
            return method() if method is not None else None

    watcher = CompileWatcher(rank=rank, step_now=step_now)
    try:
        return watcher if watcher.install() else None
    except Exception as exc:  # never stops training: compile events are off
        watcher.uninstall()
        log.warning("profcallbacks: cannot follow torch.compile's events (%s); they are off.", exc)
        return CompileWatcher(rank=rank, step_now=step_now)


def compile_segments(first: int, n: int, excluded: bool,
                     compiled: dict[int, float]) -> list[tuple[int, int, bool, float]]:
    """The block's steps ``0..n-1`` as parts ``(start, end, excluded, compile_s)``: each step
    that compiled alone and excluded, the others as they were. Compile time of
    steps before the block (``-1``: between steps) goes with its first part.

    Example:
        >>> compile_segments(10, 5, False, {12: 1.5})
        [(0, 2, False, 0.0), (2, 3, True, 1.5), (3, 5, False, 0.0)]
    """
    parts: list[tuple[int, int, bool, float]] = []
    start, early = 0, sum(s for step, s in compiled.items() if step < first)
    for step in sorted(s for s in compiled if first <= s < first + n):
        k = step - first
        if k > start:
            parts.append((start, k, excluded, 0.0))
        parts.append((k, k + 1, True, compiled[step]))
        start = k + 1
    if start < n:
        parts.append((start, n, excluded, 0.0))
    if early:
        a, b, part_excluded, seconds = parts[0]
        parts[0] = (a, b, part_excluded, seconds + early)
    return parts


class _DynamoLogHandler(logging.Handler):
    """Hands dynamo's recompile-limit warnings and graph-break lines to the watcher."""

    def __init__(self, watcher: CompileWatcher) -> None:
        super().__init__(logging.DEBUG)
        self._watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._watcher.logged(record.getMessage())
        except Exception:  # a profiler never breaks a compile
            pass


def _seconds(metric: Any) -> float:
    seconds = getattr(metric, "entire_frame_compile_time_s", None)
    if seconds is None:
        duration = getattr(metric, "duration_us", None)
        seconds = duration / 1e6 if duration else 0.0
    return float(seconds)


def _short(path: str | None) -> str:
    """The last two parts of ``path``: where a user finds it, without the checkout's root."""
    if not path:
        return "?"
    parts = path.replace("\\", "/").split("/")
    return "/".join(parts[-2:])
