"""The CPU scenarios of ``benchmarks/calibration.py``: each a training loop with one pattern, and the
same loop with the fix the report names for it applied.

A scenario builds a :class:`Loop` for ``fixed=False`` (the pattern) and ``fixed=True`` (the fix);
``kind`` is the diagnosis whose gain is the prediction (``None``: the report should name nothing
worth doing). Every loop runs on the CPU with its own seed; sizes are chosen so one step takes
5-40 ms on a small shared machine.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


@dataclass
class Loop:
    """One variant of a scenario: where batches come from and what a step does."""

    batches: Iterator[Any]
    step: Callable[[Any], None]
    threads: int = 1
    close: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class Scenario:
    """A pattern, the diagnosis kind whose gain predicts the fix, and how to build each variant."""

    name: str
    kind: str | None
    fix: str
    make: Callable[[bool], Loop]
    fast: bool = False  # cheap and steady enough for tests/test_calibration.py
    busy: bool = False  # run with a CPU burner beside it (a shared machine)
    rebuild: bool = False  # measured with fresh loops each round (memory placement varies)


def _endless(value: Any) -> Iterator[Any]:
    while True:
        yield value


class _SlowItems(Dataset[torch.Tensor]):
    """``__getitem__`` that waits 2 ms per sample (reading and decoding a file)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.full((64,), float(i % 7))


def _loader(fixed: bool) -> Loop:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    workers = 2 if fixed else 0
    loader = DataLoader(_SlowItems(), batch_size=4, num_workers=workers,
                        persistent_workers=bool(workers), prefetch_factor=4 if workers else None)
    it = iter(loader)

    def step(batch: torch.Tensor) -> None:
        for _ in range(3):
            optimizer.zero_grad()
            model(batch.repeat(64, 1)).sum().backward()
            optimizer.step()

    return Loop(it, step, close=lambda: it._shutdown_workers() if workers else None)  # type: ignore[attr-defined]


def _mlp(width: int, depth: int, fixed: bool, batch: int = 8) -> Loop:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=fixed)
    x = torch.randn(batch, width)

    def step(_: Any) -> None:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    return Loop(_endless(None), step)


def _item(fixed: bool) -> Loop:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    seen: list[float] = []

    def step(_: Any) -> None:
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        if not fixed:
            seen.append(loss.item())

    return Loop(_endless(None), step)


class _Tiny(torch.nn.Module):
    """Many elementwise operators on small tensors: the time is the dispatcher's, not arithmetic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(60):
            x = torch.tanh(x * 1.01 + 0.1) - x * 0.5
        return x


def _compiled(fixed: bool) -> Loop:
    module: Any = _Tiny()
    if fixed:
        module = torch.compile(module)
    x = torch.randn(16, 16)

    def step(_: Any) -> None:
        with torch.no_grad():
            module(x)

    return Loop(_endless(None), step)


def _copy(fixed: bool) -> Loop:
    torch.manual_seed(0)
    state = torch.randn(1024, 1024)
    update = torch.randn(1024, 1024)

    def step(_: Any) -> None:
        nonlocal state
        if fixed:
            state.mul_(0.9).add_(update, alpha=0.1)
        else:  # a copy of the whole state each step, then the update on the copy
            fresh = state.clone()
            fresh.mul_(0.9).add_(update, alpha=0.1)
            state = fresh
        torch.mm(state[:64], update[:, :64])

    return Loop(_endless(None), step)


def _threads(fixed: bool) -> Loop:
    torch.manual_seed(0)
    a = torch.randn(512, 512)  # a step of several ms: longer than the scheduler's time slice,
    b = torch.randn(512, 512)  # so another job's share of the cores shows in every step

    def step(_: Any) -> None:
        for _ in range(8):
            torch.mm(a, b)

    return Loop(_endless(None), step, threads=1 if fixed else 2)


@contextlib.contextmanager
def busy_machine() -> Iterator[None]:
    """One process spinning on a CPU for the duration (another job on a shared machine): a shell
    loop, burning from its first millisecond (a Python child would spend its first seconds
    importing this module's torch, so a capture made meanwhile would see a machine half busy)."""
    proc = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        time.sleep(0.2)  # the scheduler has placed it
        yield
    finally:
        proc.kill()
        proc.wait()


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("many small params: foreach off -> on", "unfused_optimizer",
             "Adam(foreach=True)", lambda f: _mlp(8, 80, f)),
    Scenario("few large params: foreach off -> on", "unfused_optimizer",
             "Adam(foreach=True)", lambda f: _mlp(1024, 3, f, batch=64), fast=True, rebuild=True),
    Scenario("heavy __getitem__: num_workers 0 -> 2", "input_pipeline",
             "DataLoader(num_workers=2)", _loader),
    Scenario("per-step .item() -> none", "sync_in_step", "log .item() every N steps", _item,
             fast=True),
    Scenario("out-of-place copy -> in-place", "hidden_copies", "update in place", _copy),
    Scenario("tiny-op model: eager -> torch.compile", "dispatch_bound", "torch.compile(model)",
             _compiled),
    Scenario("2 threads on a busy 2-core machine -> 1", "oversubscribed",
             "torch.set_num_threads(1)", _threads, busy=True),
    Scenario("2 threads on a quiet 2-core machine -> 1", "oversubscribed",
             "torch.set_num_threads(1)", _threads),
)
"""Every scenario, in the order the table prints them."""
