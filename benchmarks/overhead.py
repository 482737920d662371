"""In-situ cost of profcallbacks outside capture windows: plain loop, Lightning and HF Trainer.

Run: python benchmarks/overhead.py [--front-end all|plain|lightning|hf] [--rounds 40 --steps 100]
     python benchmarks/overhead.py --front-end plain --compiled   (the model under torch.compile)
     python benchmarks/overhead.py --step-ms 1,3,10 [--rounds 20]  (steps of 1-10 ms, all defaults)

Python per-step costs measured in a tight loop read 5-10x lower than between real training work
(the code and its data fall out of the CPU caches), so everything here is measured in situ:
blocks of ``--steps`` real training steps (~0.25 ms each on one CPU thread), the variants of one
round in shuffled order, each paired with a bare block of the same round. A profiled block's
timing includes the resume before it and the pause after it, which processes its last buffered
steps, so every step's block work (detectors, summaries) is counted, whatever the block length
(a little more than once: a natural block boundary comes every 128 steps, not every 100). A
second bare block per round is the control: bare/bare must read 1.00 +- 0.02, or the machine
was too noisy and the run does not count (it says so). Printed per variant: the median over
rounds of rate/bare-rate, and the cost per step it implies.

plain:     bare loop | StepProfiler (defaults but capture_on_slowdown=False: windows are not
           what this measures) | timing only | empty function call (control)
           | torch.profiler alive in its wait phase; with --compiled the model runs under
           torch.compile (inductor), compiled before the profilers open, so the compile listener
           is installed and every block runs the compiled graph
lightning: one Trainer.fit; a switch callback (present in every block) puts ProfilerCallback
           (default options, no scheduled window), or an empty Callback (what any callback costs
           in Lightning's hook machinery), in or out of trainer.callbacks between blocks, or
           Lightning's SimpleProfiler in or out of trainer.profiler
hf:        one Trainer.train; the same with the HF ProfilerCallback and an empty TrainerCallback
--step-ms: plain loops whose steps take about each given time (an MLP of as many 256-wide layers),
           blocks of about 0.5 s: bare | StepProfiler with every default detector on (memory
           sampling, the compile listener installed, slowdown, stall; the sync audit's default
           rounds done before the timed blocks) | the same with a 3-step sync audit round inside
           each of its blocks, whose excess over the defaults is one round's cost (a run with the
           default audit pays two rounds, once)
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from profcallbacks import StepProfiler, SyncAuditConfig  # noqa: E402

CONTROL_TOLERANCE = 0.02


def make_model() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(32, 64)


def training_step(model: nn.Module, opt: torch.optim.Optimizer,
                  x: torch.Tensor) -> Callable[[], None]:
    """One training step of ``model`` on the batch ``x``: forward, backward, optimizer step."""

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def make_step(compiled: bool = False) -> Callable[[], None]:
    model, opt, x = make_model()
    if compiled:
        model = torch.compile(model)  # type: ignore[assignment]
    return training_step(model, opt, x)


class Rounds:
    """Collects block rates per round and turns them into paired ratios."""

    def __init__(self, variants: list[str], rounds: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.order: list[str] = []
        for _ in range(rounds):
            names = ["bare", "bare (control)", *variants]
            rng.shuffle(names)
            self.order += names
        self.rates: list[dict[str, float]] = [{} for _ in range(rounds)]
        self.size = len(variants) + 2

    def record(self, index: int, rate: float) -> None:
        self.rates[index // self.size][self.order[index]] = rate

    def report(self, title: str, step_ms: float) -> bool:
        full = [r for r in self.rates if len(r) == self.size]
        names = [n for n in full[0] if n != "bare"]
        names.sort(key=lambda n: (n != "bare (control)", n))
        step_ms = step_ms or 1e3 / statistics.median(r["bare"] for r in full)  # per training step
        print(f"\n{title}: {len(full)} rounds, step {step_ms:.3f} ms")
        ok = True
        for name in names:
            ratio = statistics.median(r[name] / r["bare"] for r in full)
            cost_us = (1 / ratio - 1) * step_ms * 1e3
            print(f"  {name:<34} {ratio:.4f}   {cost_us:+6.1f} us/step")
            if name == "bare (control)" and abs(ratio - 1) > CONTROL_TOLERANCE:
                ok = False
        print("  control within 1.00 +- 0.02: the run counts" if ok else
              "  CONTROL OUTSIDE 1.00 +- 0.02: too noisy, this run does not count")
        return ok


def plain(rounds: int, steps: int, compiled: bool = False) -> bool:
    step = make_step(compiled)
    for _ in range(300):
        step()
    with tempfile.TemporaryDirectory() as logdir:
        defaults = StepProfiler(f"{logdir}/a", schedule=None, capture_on_slowdown=False)
        timing = StepProfiler(f"{logdir}/b", schedule=None, stall=None, slowdown=None,
                              sync_audit=False, tensorboard_scalars=False,
                              watch_capture_file=False)
        # the same defaults without the compile listener: what the listener itself costs
        unheard = StepProfiler(f"{logdir}/c", schedule=None, capture_on_slowdown=False)
        alive = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=10**9, warmup=1, active=1))

        def empty() -> None:
            pass

        with defaults, timing, unheard, alive:  # prof.step as users get it: in the with block
            if compiled:
                _silence_compile_listener(unheard)
            variants: dict[str, tuple[Callable[[], None] | None, StepProfiler | None]] = {
                "bare": (None, None), "bare (control)": (None, None),
                "StepProfiler (defaults)": (defaults.step, defaults),
                "StepProfiler (timing only)": (timing.step, timing),
                "empty function call": (empty, None),
                "torch.profiler (wait phase)": (alive.step, None)}
            if compiled:
                variants["StepProfiler (defaults, listener off)"] = (unheard.step, unheard)
            plan = Rounds([n for n in variants if not n.startswith("bare")], rounds)
            defaults.pause()
            timing.pause()
            unheard.pause()
            for _ in range(300):  # past the sync audit and the detectors' warm-up
                step()
            for prof in (defaults, timing, unheard):
                prof.resume()
                for _ in range(150):
                    step()
                    prof.step()
                prof.pause()
            for index, name in enumerate(plan.order):
                after, prof = variants[name]
                start = time.perf_counter()
                if prof is not None:  # timed too: a block begins here
                    prof.resume()
                if after is None:
                    for _ in range(steps):
                        step()
                else:
                    for _ in range(steps):
                        step()
                        after()
                if prof is not None:  # inside the timing: it processes the block's last steps
                    prof.pause()
                plan.record(index, steps / (time.perf_counter() - start))
    if defaults.findings or defaults.captures:
        print("  (defaults made findings or captures during the benchmark: "
              f"{sorted({f.kind for f in defaults.findings})}, {len(defaults.captures)} captures)")
    start = time.perf_counter()
    for _ in range(500):
        step()
    if compiled:
        watcher = defaults.session._compile
        print(f"  (compile listener installed: {watcher is not None}; compile time while "
              f"profiled: {defaults.session.compile_s:.3f} s)")
    return plan.report("plain loop" + (" (torch.compile)" if compiled else ""),
                       (time.perf_counter() - start) / 500 * 1e3)


def make_deep_step(layers: int) -> Callable[[], None]:
    """A training step of ``layers`` 256-wide linear layers on a batch of 64 (one CPU thread)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*blocks, nn.Linear(256, 1))
    return training_step(model, torch.optim.SGD(model.parameters(), lr=1e-4), torch.randn(64, 256))


def step_of(target_ms: float) -> tuple[Callable[[], None], int]:
    """A step taking about ``target_ms`` here, and its layer count (from a 4-layer probe)."""
    probe = make_deep_step(4)
    for _ in range(20):
        probe()
    start = time.perf_counter()
    for _ in range(50):
        probe()
    per_layer_ms = (time.perf_counter() - start) / 50 * 1e3 / 4
    layers = max(1, round(target_ms / per_layer_ms))
    return make_deep_step(layers), layers


def plain_range(rounds: int, targets: list[float]) -> bool:
    """Steps of about each of ``targets`` ms with every default detector on (see the docstring)."""
    import torch._dynamo  # noqa: F401  # what torch.compile imports: the compile listener installs

    counted = []
    for target_ms in targets:
        step, layers = step_of(target_ms)
        for _ in range(50):
            step()
        start = time.perf_counter()
        for _ in range(20):
            step()
        step_ms = (time.perf_counter() - start) / 20 * 1e3
        steps = max(20, round(500 / step_ms))  # blocks of about 0.5 s
        warm = 110  # past the default audit rounds (steps 19-21 and 99-101)
        plan = Rounds(["StepProfiler (all defaults)", "defaults + an audit round per block"],
                      rounds, seed=int(target_ms * 1000))
        audited = [warm + k * steps + steps // 2 for k in range(rounds)]  # mid-block rounds
        with tempfile.TemporaryDirectory() as logdir:
            defaults = StepProfiler(f"{logdir}/a", schedule=None, capture_on_slowdown=False)
            audits = StepProfiler(f"{logdir}/b", schedule=None, capture_on_slowdown=False,
                                  sync_audit=SyncAuditConfig(at_step=19, repeat_at=(99, *audited)))
            with defaults, audits:
                listening = [p.session._compile is not None for p in (defaults, audits)]
                variants = {"bare": None, "bare (control)": None,
                            "StepProfiler (all defaults)": defaults,
                            "defaults + an audit round per block": audits}
                for prof in (defaults, audits):
                    for _ in range(warm):
                        step()
                        prof.step()
                    prof.pause()
                for index, name in enumerate(plan.order):
                    timed = variants[name]
                    begin = time.perf_counter()
                    if timed is None:
                        for _ in range(steps):
                            step()
                    else:
                        timed.resume()
                        for _ in range(steps):
                            step()
                            timed.step()
                        timed.pause()
                    plan.record(index, steps / (time.perf_counter() - begin))
            audit_rounds = sum(1 for f in audits.findings if f.kind == "sync_audit"
                               and f.details.get("ran"))
            print(f"\n  ({layers} layers; compile listener installed: {all(listening)}; memory "
                  f"sampling: {defaults.session.config.memory is not None}; audit rounds run in "
                  f"the audited variant: {audit_rounds}; defaults' findings: "
                  f"{sorted({f.kind for f in defaults.findings})})")
            counted.append(plan.report(f"plain loop, ~{target_ms:g} ms steps, blocks of {steps}",
                                       step_ms))
    return all(counted)


def _silence_compile_listener(prof: StepProfiler) -> None:
    """Take the compile listener out of ``prof``'s session (for the benchmark's comparison)."""
    from profcallbacks.detect.compile_watch import CompileWatcher

    session = prof.session
    if session._compile is not None:
        session._compile.uninstall()
    session._compile = CompileWatcher(rank=0, step_now=lambda: None)  # never installed


class _Switch:
    """Times blocks of steps and puts the block's callback (if any) in the callback list."""

    def __init__(self, plan: Rounds, steps: int,
                 variants: dict[str, tuple[Any, Callable[[], None], Callable[[], None]]]) -> None:
        self.plan, self.steps, self.variants = plan, steps, variants
        self.callbacks: list[Any] = []
        self.count = -1
        self.block = -1
        self.start = 0.0
        self.warmup = 400
        self.current: str | None = None

    def tick(self) -> None:
        self.count += 1
        if self.count < self.warmup or (self.count - self.warmup) % self.steps:
            return
        wanted = self.plan.order[self.block + 1] if self.block + 1 < len(self.plan.order) else None
        wanted = wanted if wanted in self.variants else None
        if wanted != self.current and self.current is not None:
            callback, _, off = self.variants[self.current]
            if callback is not None:
                self.callbacks.remove(callback)
            off()  # timed with the block: it processes the block's last buffered steps
        now = time.perf_counter()
        if self.block >= 0:
            self.plan.record(self.block, self.steps / (now - self.start))
        self.block += 1
        if wanted != self.current:
            if wanted is not None:
                callback, on, _ = self.variants[wanted]
                if callback is not None:
                    self.callbacks.append(callback)
                on()
            self.current = wanted
        self.start = time.perf_counter()

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps * (len(self.plan.order) + 1)


def _nothing() -> None:
    pass


def lightning(rounds: int, steps: int) -> bool:
    import lightning.pytorch as pl
    from lightning.pytorch.profilers import SimpleProfiler
    from torch.utils.data import DataLoader, TensorDataset

    from profcallbacks.lightning import ProfilerCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()[0]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    plan = Rounds(["ProfilerCallback (defaults)", "empty Callback (control)",
                   "Trainer(profiler=SimpleProfiler())"], rounds)
    ours = ProfilerCallback(schedule=None, capture_on_slowdown=False)
    simple = SimpleProfiler()

    class SwitchCallback(pl.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            switch.tick()

    def simple_on() -> None:
        trainer.profiler = simple  # Lightning's own: a start/stop pair around every hook

    def simple_off() -> None:
        trainer.profiler = ours._fetch_timer.inner

    def on() -> None:
        trainer.profiler = ours._fetch_timer
        ours.session.resume()

    def off() -> None:
        ours.session.pause()
        trainer.profiler = ours._fetch_timer.inner

    with tempfile.TemporaryDirectory() as logdir:
        trainer = pl.Trainer(default_root_dir=logdir, max_steps=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[SwitchCallback(), ours])
        switch = _Switch(plan, steps, {"ProfilerCallback (defaults)": (ours, on, off),
                                       "empty Callback (control)": (pl.Callback(), _nothing,
                                                                    _nothing),
                                       "Trainer(profiler=SimpleProfiler())": (None, simple_on,
                                                                              simple_off)})
        switch.callbacks = trainer.callbacks
        switch.current = "ProfilerCallback (defaults)"  # in the list for on_train_start
        trainer.fit_loop.epoch_loop.max_steps = switch.total_steps
        data = TensorDataset(torch.randn(32 * 64, 64))
        trainer.fit(Module(), DataLoader(data, batch_size=32, shuffle=False))
        if ours not in trainer.callbacks:  # the last block was not ours: end the session here
            ours._close(failed=False)
    return plan.report("Lightning Trainer.fit (blocks inside one fit)", 0.0)


def hf(rounds: int, steps: int) -> bool:
    import transformers
    from transformers import TrainerCallback

    from profcallbacks.hf import ProfilerCallback

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()[0]

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.net(x).pow(2).mean()}

    plan = Rounds(["ProfilerCallback (defaults)", "empty TrainerCallback (control)"], rounds)
    ours = ProfilerCallback(schedule=None, capture_on_slowdown=False)

    class SwitchCallback(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            switch.tick()

    def on() -> None:
        ours.session.resume()

    def off() -> None:
        ours.session.pause()

    data = [{"x": torch.randn(64)} for _ in range(32 * 64)]
    with tempfile.TemporaryDirectory() as logdir:
        switch = _Switch(plan, steps, {"ProfilerCallback (defaults)": (ours, on, off),
                                       "empty TrainerCallback (control)": (TrainerCallback(),
                                                                           _nothing, _nothing)})
        switch.current = "ProfilerCallback (defaults)"  # in the list for on_train_begin
        args = transformers.TrainingArguments(
            output_dir=logdir, max_steps=switch.total_steps, per_device_train_batch_size=32,
            use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
            dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
        trainer = transformers.Trainer(model=Model(), args=args, train_dataset=data,
                                       callbacks=[SwitchCallback(), ours])
        switch.callbacks = trainer.callback_handler.callbacks
        trainer.train()
        ours.close(failed=False)  # the last block may have been bare (no on_train_end for ours)
    return plan.report("HF Trainer.train (blocks inside one train)", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--front-end", choices=["all", "plain", "lightning", "hf"], default="all")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--compiled", action="store_true",
                        help="run the plain loop's model under torch.compile")
    parser.add_argument("--step-ms", default=None,
                        help="plain loops of steps of about these times, all defaults: 1,3,10")
    args = parser.parse_args()
    if args.compiled and args.front_end != "plain":
        parser.error("--compiled needs --front-end plain")
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    if args.step_ms is not None:
        try:
            targets = [float(t) for t in args.step_ms.split(",")]
        except ValueError:
            parser.error(f"--step-ms {args.step_ms!r}: expected times in ms, e.g. 1,3,10")
        if not targets or min(targets) <= 0:
            parser.error(f"--step-ms {args.step_ms!r}: times must be positive, e.g. 1,3,10")
        counted = plain_range(args.rounds, targets)
        print("\nall runs count" if counted else "\nsome runs do not count (noisy machine)")
        return
    runs: dict[str, Callable[[int, int], bool]] = {
        "plain": lambda r, s: plain(r, s, args.compiled), "lightning": lightning, "hf": hf}
    chosen = list(runs) if args.front_end == "all" else [args.front_end]
    counted = [runs[name](args.rounds, args.steps) for name in chosen]
    print("\nall runs count" if all(counted) else "\nsome runs do not count (noisy machine)")


if __name__ == "__main__":
    main()
