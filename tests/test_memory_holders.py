"""Memory sites name the line that keeps the memory (the append or attribute store), the
allocation line as the second clue, and the bytes kept."""

from __future__ import annotations

import torch

from helpers import QUIET
from profcallbacks import MemoryConfig, StepProfiler
from profcallbacks.core.triggers import MEMORY
from profcallbacks.detect.memory_sites import MemorySiteSpy
from profcallbacks.findings import MEMORY_SITES
from sync_scenario import location

HISTORY: list[torch.Tensor] = []


class Tracker:
    """Keeps each step's outputs on an attribute, as metric helpers do."""

    def __init__(self) -> None:
        self.outputs: list[torch.Tensor] = []
        self.last: torch.Tensor | None = None

    def update(self, out: torch.Tensor) -> None:
        self.outputs.append(out.detach())  # SYNC: tracker-append
        self.last = out.detach() * 2  # SYNC: tracker-last


def sites_of(prof: StepProfiler) -> list[dict]:
    [finding] = [f for f in prof.findings if f.kind == MEMORY_SITES]
    return finding.details["sites"]


def test_losses_append_is_named_as_the_line_that_keeps_the_memory(tmp_path):
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, all_logits = [], []
    prof = StepProfiler(tmp_path, memory=MemoryConfig(sample_every_s=0), **QUIET)
    with prof:
        for step in range(20):
            if step == 5:
                prof.session.request_capture(trigger=MEMORY)
            out = model(torch.randn(64, 16))  # SYNC: make-out
            loss = out.pow(2).mean()  # SYNC: make-loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            all_logits.append(out)  # SYNC: keep-out
            losses.append(loss)  # SYNC: keep-loss
            prof.step()
    here = __file__
    by_line = {s["location"]: s for s in sites_of(prof)}
    logits, kept_losses = by_line[location("keep-out", here)], by_line[location("keep-loss", here)]
    assert logits["allocated_at"] == location("make-out", here)
    assert logits["count"] == 3 and logits["bytes"] == 3 * 64 * 16 * 4
    test = "test_losses_append_is_named_as_the_line_that_keeps_the_memory"
    assert logits["held_by"] == f"all_logits (a list in {test}())"
    assert kept_losses["allocated_at"] == location("make-loss", here)
    assert kept_losses["count"] == 3 and kept_losses["bytes"] == 3 * 4
    assert kept_losses["autograd_graph"] is True and logits["autograd_graph"] is True
    [finding] = [f for f in prof.findings if f.kind == MEMORY_SITES]
    assert f"{location('keep-loss', here)} keeps 12 bytes in 3 tensors (losses" in finding.message
    assert f"allocated at {location('make-loss', here)}" in finding.message


def test_attribute_stores_and_module_lists_are_named():
    tracker = Tracker()
    linear = torch.nn.Linear(8, 32)
    with MemorySiteSpy() as spy:
        for _ in range(2):
            out = linear(torch.randn(4, 8))  # SYNC: make
            tracker.update(out)
            HISTORY.append(torch.zeros(100) + out.sum().detach())  # SYNC: module-list
    del out
    here = __file__
    sites = {s["location"]: s for s in spy.alive_sites()}
    appended = sites[location("tracker-append", here)]
    assert appended["allocated_at"] == location("make", here)
    assert appended["held_by"] == "Tracker.outputs (a list)" and appended["count"] == 2
    last = sites[location("tracker-last", here)]
    assert last["held_by"] == "Tracker.last" and last["count"] == 1  # the other one was freed
    kept = sites[location("module-list", here)]
    assert kept["held_by"].startswith("HISTORY (a list of ") and kept["count"] == 2
    HISTORY.clear()


def test_a_list_inside_a_dict_is_named_at_its_append():
    """``history["loss"].append(loss)``: the list sits in a dict, the dict in the loop's locals."""
    linear = torch.nn.Linear(8, 32)
    history: dict[str, list[torch.Tensor]] = {"loss": []}
    with MemorySiteSpy() as spy:
        for _ in range(3):
            out = linear(torch.randn(4, 8)).sum()  # SYNC: make-nested
            history["loss"].append(out)  # SYNC: nested-append
    del out
    here = __file__
    sites = {s["location"]: s for s in spy.alive_sites()}
    kept = sites[location("nested-append", here)]
    assert kept["allocated_at"] == location("make-nested", here) and kept["count"] == 3
    test = "test_a_list_inside_a_dict_is_named_at_its_append"
    assert kept["held_by"] == f"a list in history (a dict in {test}())"
    assert kept["autograd_graph"] is True
