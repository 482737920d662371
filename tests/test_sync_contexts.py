"""Values made under ``inference_mode``, ``no_grad``, ``autocast`` and ``torch.func`` transforms
keep their batch-or-parameter provenance: their syncs are found at the same lines as under autograd."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.func import functional_call, grad_and_value

from profcallbacks import StepProfiler, SyncAuditConfig
from profcallbacks.detect.sync_audit import audit_findings_of
from sync_scenario import location

OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
               watch_capture_file=False, memory=None, sync_audit=SyncAuditConfig(at_step=2, repeat_at=()))
F = torch.nn.functional
CONTEXTS = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad,
            "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            "autograd": contextlib.nullcontext}


def accuracy(output, target, context, topk=(1,)):
    """torchvision references' ``utils.accuracy``, as written there, under ``context``."""
    with context():
        maxk = max(topk)
        batch_size = target.size(0)
        if target.ndim == 2:
            target = target.max(dim=1)[1]

        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])

        res = []
        for k in topk:
            correct_k = correct[:k].flatten().sum(dtype=torch.float32)
            res.append(correct_k * (100.0 / batch_size))
        return res


def batches():
    torch.manual_seed(0)
    return [(torch.randn(8, 16), torch.randint(0, 10, (8,))) for _ in range(6)]


def user_sites(prof: StepProfiler) -> set[tuple[str, str]]:
    return {(f.details["location"], f.details["op"]) for f in audit_findings_of(prof.findings)}


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_a_metric_item_is_found_at_its_line_whatever_context_made_the_metric(tmp_path, name):
    """torchvision's train_one_epoch: ``loss.item()``, then ``acc1.item()``, ``acc5.item()`` of
    metrics computed under ``inference_mode`` (here also no_grad, autocast, plain autograd)."""
    model = torch.nn.Linear(16, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = StepProfiler(tmp_path, **OPTIONS)
    with prof:
        for image, target in prof.wrap(batches()):
            output = model(image)
            loss = F.cross_entropy(output, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc1, acc5 = accuracy(output, target, CONTEXTS[name], topk=(1, 5))
            logged = {"loss": loss.item()}  # SYNC: loss
            logged["acc1"] = acc1.item()  # SYNC: acc1
            logged["acc5"] = acc5.item()  # SYNC: acc5
            prof.step()
    here = __file__
    assert user_sites(prof) == {(location(m, here), "item") for m in ("loss", "acc1", "acc5")}


def test_inference_mode_where_and_nonzero_are_found(tmp_path):
    """Ops that autograd would decompose (``where(mask)``, ``argwhere``) reach the audit whole."""
    model = torch.nn.Linear(16, 10)
    prof = StepProfiler(tmp_path, **OPTIONS)
    with prof:
        for image, _ in prof.wrap(batches()):
            with torch.inference_mode():
                scores = model(image)
                rows, cols = torch.where(scores > 0)  # SYNC: where
                peaks = torch.argwhere(scores > 1)  # SYNC: argwhere
                close = torch.allclose(scores, scores)  # SYNC: allclose
            del rows, cols, peaks, close
            prof.step()
    here = __file__
    assert user_sites(prof) == {(location("where", here), "nonzero"),
                                (location("argwhere", here), "nonzero"),
                                (location("allclose", here), "torch.allclose")}


def test_torch_func_grads_and_loss_are_followed(tmp_path):
    """``torch.func.grad_and_value`` over detached parameters: the loss and the gradients derive
    from the batch, so their ``.item()`` counts on a CPU run."""
    model = torch.nn.Linear(16, 10)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_fn(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x,)), y)

    prof = StepProfiler(tmp_path, **OPTIONS)
    with prof:
        for image, target in prof.wrap(batches()):
            grads, loss = grad_and_value(loss_fn)(params, image, target)
            params = {k: p - 0.1 * grads[k] for k, p in params.items()}
            norm = grads["weight"].norm().item()  # SYNC: norm
            value = loss.item()  # SYNC: value
            del norm, value
            prof.step()
    here = __file__
    assert user_sites(prof) == {(location("norm", here), "item"), (location("value", here), "item")}
