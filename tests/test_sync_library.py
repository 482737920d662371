"""Syncs torch performs on the user's behalf, reported at the user's line with torch's own fix,
on a CPU run ("would sync on an accelerator")."""

from __future__ import annotations

import torch
from torch import nn

from profcallbacks import StepProfiler, SyncAuditConfig
from profcallbacks.findings import SYNC_POINT
from sync_scenario import location

OPTIONS = dict(schedule=None, tensorboard_scalars=False, slowdown=None, stall=None,
               watch_capture_file=False, memory=None, sync_audit=SyncAuditConfig(at_step=2, repeat_at=()))


class TransformerModel(nn.Module):
    """pytorch/examples word_language_model's encoder: a causal mask cached on the model and
    passed as ``mask=`` with ``is_causal`` left at ``None`` (unless ``is_causal`` is given)."""

    def __init__(self, is_causal: bool | None = None) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.decoder = nn.Linear(16, 10)
        self.src_mask: torch.Tensor | None = None
        self.is_causal = is_causal

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        if self.src_mask is None or self.src_mask.size(0) != len(src):
            self.src_mask = nn.Transformer.generate_square_subsequent_mask(len(src))
        output = self.encoder(src, mask=self.src_mask, is_causal=self.is_causal)  # SYNC: encoder
        return self.decoder(output)


def train(tmp_path, model: nn.Module) -> StepProfiler:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(6, 4, 16), torch.randint(0, 10, (6, 4))) for _ in range(6)]
    prof = StepProfiler(tmp_path, **OPTIONS)
    with prof:
        for src, target in prof.wrap(batches):
            loss = nn.functional.cross_entropy(model(src).view(-1, 10), target.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    return prof


def sync_points(prof: StepProfiler) -> list:
    return [f for f in prof.findings if f.kind == SYNC_POINT]


def test_a_transformer_encoder_mask_check_is_found_at_the_users_line_with_is_causal(tmp_path):
    [finding] = sync_points(train(tmp_path, TransformerModel()))
    details = finding.details
    assert details["location"] == location("encoder", __file__)
    assert details["library"] == "torch" and details["calls_per_step"] == 1
    [site] = details["library_sites"]
    assert site["location"].replace("\\", "/").split(":")[0].endswith("torch/nn/modules/transformer.py")
    assert site["op"] == "bool(tensor)" and "is_causal=True" in site["fix"]
    assert "would sync on an accelerator" in finding.message and "is_causal=True" in finding.message
    assert details["seen_at_steps"] == [2, 3, 4]  # every audited step: the first one too


def test_is_causal_true_leaves_nothing_to_report(tmp_path):
    assert sync_points(train(tmp_path, TransformerModel(is_causal=True))) == []


def test_repeat_interleave_without_output_size_gets_the_output_size_fix(tmp_path):
    prof = StepProfiler(tmp_path, **OPTIONS)
    weight = nn.Parameter(torch.ones(4))
    with prof:
        for counts in prof.wrap([torch.tensor([1, 2, 1, 3])] * 6):
            spread = weight.repeat_interleave(counts)  # SYNC: spread
            known = weight.repeat_interleave(counts, output_size=7)  # given: nothing read back
            (spread.sum() + known.sum()).backward()
            prof.step()
    [finding] = sync_points(prof)
    assert finding.details["location"] == location("spread", __file__)
    assert finding.details["op"] == "repeat_interleave"
    assert "output_size=" in finding.details["fix"] and "output_size=" in finding.message
