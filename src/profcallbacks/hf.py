"""The Hugging Face Trainer front end: a ``TrainerCallback`` that drives the core session."""

from __future__ import annotations

import logging
import os
import socket
import sys
import weakref
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("profcallbacks.hf needs transformers: pip install 'profcallbacks[hf]'") from exc

from typing_extensions import override

from profcallbacks.core.ranks import RankInfo
from profcallbacks.core.triggers import MANUAL, VALIDATION
from profcallbacks.findings import Finding, FindingHandler
from profcallbacks.integrations.base import RunLog, check_metrics_sink, close_quietly, extra_sinks
from profcallbacks.integrations.report_to import report_to_sinks
from profcallbacks.options.bounds import check_capture_steps
from profcallbacks.options.front_end import ProfilerOptions, Unpack, takes_profiler_options
from profcallbacks.options.profiler import ProfilerConfig
from profcallbacks.run.session import ProfilingSession
from profcallbacks.run.sinks import MetricsSink

log = logging.getLogger(__name__)


class ProfilerCallback(TrainerCallback):
    """Profiles a Hugging Face ``Trainer`` run: step timing always, torch.profiler only in windows.

    A step is one optimizer step: its micro-batches' fetch, forward and backward, and the
    optimizer step. Logging, evaluation and checkpoint saving between steps belong to no step.
    Options are those of :class:`~profcallbacks.StepProfiler`. Step-time scalars and findings
    go to the W&B and MLflow runs that ``report_to`` integrations opened
    (:mod:`profcallbacks.integrations.report_to`) and into the TensorBoard event file in
    ``logdir``; the scalars also join the Trainer's next logs (``trainer_state.json``).

    Args:
        logdir: Directory for traces, scalars and findings. ``None``: where the Trainer's
            TensorBoard integration writes (``$TENSORBOARD_LOGGING_DIR`` or
            ``output_dir/runs/<date>_<host>``; ``args.logging_dir`` on transformers 4.x).

    If ``train()`` raises, the Trainer calls no hook: the capture in progress is stopped and
    exported as ``-partial`` when this callback is garbage-collected or the interpreter exits,
    or at once by :meth:`close`.

    Example:
        >>> from profcallbacks import Schedule
        >>> cb = ProfilerCallback(schedule=Schedule(skip_first=10, active=3))
        >>> Trainer(model, args, train_dataset=ds, callbacks=[cb]).train()  # doctest: +SKIP
        >>> cb.findings, cb.captures                                        # doctest: +SKIP
    """

    @takes_profiler_options
    def __init__(self, logdir: str | os.PathLike[str] | None = None, *,
                 on_finding: FindingHandler | None = None, metrics_sink: MetricsSink | None = None,
                 **options: Unpack[ProfilerOptions]) -> None:
        self.config = ProfilerConfig.from_arguments(type(self).__name__, dict(options),
                                                    logdir=logdir, on_finding=on_finding)
        self._metrics_sink = check_metrics_sink(type(self).__name__, metrics_sink)
        self.logdir = None if logdir is None else Path(logdir)
        self.session: ProfilingSession | None = None
        self._on_finding = on_finding
        self._requests: list[int | None] = []
        self._metrics = _LatestMetrics()
        self._closer: weakref.finalize | None = None
        self._report_to: list[RunLog] = []

    @classmethod
    def from_config(cls, config: ProfilerConfig, logdir: str | os.PathLike[str] | None = None, *,
                    on_finding: FindingHandler | None = None,
                    metrics_sink: MetricsSink | None = None) -> ProfilerCallback:
        """A callback with the options of ``config`` (one config shared by several front ends)."""
        return cls(logdir, **config.options(), on_finding=on_finding, metrics_sink=metrics_sink)

    @property
    def findings(self) -> list[Finding]:
        return self.session.findings if self.session else []

    @property
    def captures(self) -> list[Path]:
        """Capture directories written so far."""
        return self.session.captures if self.session else []

    def capture(self, steps: int | None = None) -> None:
        """Capture ``steps`` steps (default ``capture_steps``) from the next step on."""
        check_capture_steps(steps)
        if self._closer is not None and self.session is not None:
            self.session.request_capture(steps, trigger=MANUAL)
            return
        self._requests.append(steps)  # before train(): asked for as soon as training starts

    def close(self, *, failed: bool = True, error: BaseException | None = None) -> None:
        """Stop any capture (exported as partial) and finish exports.

        Called by ``on_train_end``; call it yourself after ``train()`` raised if the process
        goes on (inside ``except``, or with ``error=``: an out-of-memory error then gets its
        ``out_of_memory`` finding; the Trainer has no hook for errors). Safe to call more than once.
        """
        closer, self._closer = self._closer, None
        if closer is not None and closer.detach() is not None and self.session is not None:
            error = error if error is not None else sys.exc_info()[1]
            if failed and error is not None:
                self.session.on_exception(error)
            self.session.close(failed=failed)
            for sink in self._report_to:
                close_quietly(sink)
            self._report_to = []

    @override
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        self.close()  # a retry (auto_find_batch_size) after a failed train(): end that one first
        rank = RankInfo.detect()
        logdir = self.logdir or tensorboard_logdir(args, state, rank)
        own = self._metrics_sink  # the user's own sink or tracker run, beside report_to's
        self._report_to = (report_to_sinks(args.report_to,
                                           log_captures=self.config.tracker_captures)
                           if state.is_world_process_zero else [])
        self._report_to += [own] if isinstance(own, RunLog) else []
        plain = [] if isinstance(own, RunLog) else extra_sinks(own)
        session = ProfilingSession(self.config, logdir, rank=rank, on_finding=self._on_finding,
                                   metrics_sinks=[self._metrics.update, *self._report_to, *plain],
                                   start_step=state.global_step,
                                   log_findings=state.is_world_process_zero)
        for sink in self._report_to:  # findings into the W&B / MLflow runs the Trainer opened
            session.add_finding_handler(sink.finding)
        for steps in self._requests:  # asked for before train(): the window starts at once
            session.request_capture(steps, trigger=MANUAL)
        self._requests.clear()
        session.open()
        if kwargs.get("train_dataloader") is not None:
            session.set_loader(kwargs["train_dataloader"])  # its settings shape stall advice
            session.loader_workers.attach(kwargs["train_dataloader"])  # its workers' timing
        self.session = session
        self._closer = weakref.finalize(self, session.close, failed=True)
        session.pause()  # evaluation on start and the epoch's set-up belong to no step

    @override
    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if self._closer is not None and self.session is not None:
            if kwargs.get("train_dataloader") is not None:  # a further pass: workers may restart
                self.session.set_loader(kwargs["train_dataloader"])
                self.session.loader_workers.attach(kwargs["train_dataloader"])
            self.session.resume()

    @override
    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        # The Trainer fetched every micro-batch of this step before this hook.
        if self._closer is not None and self.session is not None:
            self.session.resume()  # only if a pause was never closed by a hook (a safety net)
            self.session.batch_arrived()

    @override
    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self._closer is not None and self.session is not None:
            self.session.step_end()
            if _work_announced(control):  # logging, evaluation or saving runs next
                self.session.pause(VALIDATION if control.should_evaluate else None)

    @override
    def on_epoch_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self._closer is not None and self.session is not None and _work_announced(control):
            self.session.pause()

    @override
    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self._closer is None or self.session is None:
            return
        values = self._metrics.take()
        if values and logs is not None:
            logs.update(values)  # callbacks after this one (the printer) see them
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(values)  # and trainer_state.json keeps them
        self._resume_when_done(args, control, after_evaluate=False)

    @override
    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self._closer is not None and self.session is not None:
            self._resume_when_done(args, control, after_evaluate=True)

    @override
    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self._closer is not None and self.session is not None:
            self._resume_when_done(args, control, after_evaluate=False)

    @override
    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.close(failed=False)

    def _resume_when_done(self, args: TrainingArguments, control: TrainerControl, *,
                          after_evaluate: bool) -> None:
        """Resume step timing once the last announced log/evaluate/save hook has run."""
        assert self.session is not None
        if _work_announced(control):
            return
        if after_evaluate and args.save_strategy == "best":
            return  # the Trainer decides after this hook whether to save: on_save resumes, or
            # the next on_step_begin when it does not save
        self.session.resume()


class _LatestMetrics:
    """The newest step-time summary, handed once to the Trainer's next log (to ``report_to``)."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def update(self, values: dict[str, float], step: int) -> None:
        self._values = dict(values)

    def take(self) -> dict[str, float]:
        values, self._values = self._values, {}
        return values


def _work_announced(control: TrainerControl) -> bool:
    """The Trainer will log, evaluate or save before fetching the next step's batches."""
    return bool(control.should_log or control.should_evaluate or control.should_save)


def tensorboard_logdir(args: TrainingArguments, state: TrainerState, rank: RankInfo) -> Path:
    """The directory the Trainer's TensorBoard integration writes to, equal on every rank.

    transformers 4.x: ``args.logging_dir``. 5.x: ``$TENSORBOARD_LOGGING_DIR``, else
    ``output_dir/runs/<date>_<host>`` named at the integration's ``on_train_begin``, which runs
    before ours (other integrations may run in between for seconds: ``wandb.init``): the
    directory where this process opened an event file (the integration's writer opens one at
    once, named with the host and the process id) is that one; without one (TensorBoard not in
    ``report_to``), the name of this second. With several ranks, rank 0's choice is broadcast
    (in 4.x too: each process names ``logging_dir`` from its own clock, so ranks starting across a
    second boundary disagree).
    """
    legacy = getattr(args, "logging_dir", None)  # 4.x: named per process, from its own clock
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if legacy:
        path = Path(legacy)
    elif env:
        path = Path(env).expanduser()
    else:
        runs = Path(args.output_dir or ".") / "runs"
        trial = state.trial_name if state.is_hyper_param_search and state.trial_name else None
        path = _own_event_dir(runs, trial) or runs / f"{datetime.now():%b%d_%H-%M-%S}_{socket.gethostname()}"
        if trial is not None and path.name != trial:
            path = path / trial
    return _from_rank_zero(path) if rank.is_distributed else path


def _own_event_dir(runs: Path, trial: str | None) -> Path | None:
    """The directory below ``runs`` (``runs/<name>`` or ``runs/<name>/<trial>``) holding the newest
    TensorBoard event file this process opened (``events.out.tfevents.<time>.<host>.<pid>.<n>``)."""
    mark = f".{socket.gethostname()}.{os.getpid()}."
    newest: tuple[float, Path] | None = None
    try:
        dirs = [d for d in runs.iterdir() if d.is_dir()]
    except OSError:
        return None
    for directory in dirs + ([d / trial for d in dirs] if trial else []):
        try:
            files = [f for f in directory.iterdir()
                     if f.name.startswith("events.out.tfevents.") and mark in f.name]
            for file in files:
                stamp = file.stat().st_mtime
                if newest is None or stamp > newest[0]:
                    newest = (stamp, directory)
        except OSError:
            continue
    return None if newest is None else newest[1]


def _from_rank_zero(path: Path) -> Path:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return path
    box: list[Any] = [str(path)]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])
