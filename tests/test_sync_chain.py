"""Sync sites users can act on: the call chain down to the sync, implicit conversions named."""

from __future__ import annotations

import os

import torch

from profcallbacks import StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import audit_findings_of
from sync_scenario import location, marked_line

OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
               watch_capture_file=False, memory=None)
HERE = os.path.relpath(__file__)


class AverageMeter:
    """The ImageNet example's meter: it keeps the loss tensor and formats it when printed."""

    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt, self.val = name, fmt, torch.zeros(())

    def update(self, val: torch.Tensor) -> None:
        self.val = val

    def __str__(self) -> str:
        fmtstr = "{name} {val" + self.fmt + "}"
        return fmtstr.format(**self.__dict__)  # SYNC: format


class ProgressMeter:
    def __init__(self, *meters: AverageMeter) -> None:
        self.meters = meters
        self.lines: list[str] = []

    def display(self, batch: int) -> None:
        self.lines.append(f"[{batch}] " + "\t".join(str(m) for m in self.meters))  # SYNC: str


def train(logdir) -> StepProfiler:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = AverageMeter("Loss", ":.4e")
    progress = ProgressMeter(losses)
    table = list(range(100))
    prof = StepProfiler(logdir, sync_audit=SyncAuditConfig(at_step=2, repeat_at=()), **OPTIONS)
    with prof:
        for i in range(6):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.update(loss.detach())
            progress.display(i + 1)  # SYNC: display
            if loss > 0:  # SYNC: if
                table[(loss * 10).long()] += 1  # SYNC: index
            prof.step()
    return prof


def test_a_sync_inside_str_shows_its_call_chain_and_the_implicit_format(tmp_path):
    sites = {f.details["location"]: f for f in audit_findings_of(train(tmp_path).findings)}
    fmt = sites[location("format", __file__)]
    assert fmt.details["implicit"] == "Tensor.__format__"
    assert fmt.details["call_chain"][-4:] == [  # the innermost user frames (a generator's folded)
        f"{HERE}:{marked_line('display', __file__)} train",
        f"{HERE}:{marked_line('str', __file__)} ProgressMeter.display",
        f"{HERE}:{marked_line('format', __file__)} AverageMeter.__str__",
        "Tensor.__format__"]
    assert "(Tensor.__format__, called implicitly)" in fmt.message
    assert (f"{HERE}:{marked_line('display', __file__)} train -> {HERE}:"
            f"{marked_line('str', __file__)} ProgressMeter.display -> ") in fmt.message


def test_implicit_bool_and_index_are_named(tmp_path):
    sites = {f.details["location"]: f for f in audit_findings_of(train(tmp_path).findings)}
    assert sites[location("if", __file__)].details["implicit"] == "Tensor.__bool__"
    assert sites[location("if", __file__)].details["op"] == "bool(tensor)"
    assert sites[location("index", __file__)].details["implicit"] == "Tensor.__index__"
    assert sites[location("index", __file__)].details["call_chain"][-2:] == [
        f"{HERE}:{marked_line('index', __file__)} train", "Tensor.__index__"]
