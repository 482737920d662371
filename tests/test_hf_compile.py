"""A recompile under the HF Trainer's ``torch_compile=True`` is named at the model's ``forward``
(its decorators' pass-throughs folded in) and at the user's training line."""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo

from profcallbacks.findings import RECOMPILE

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Lengths(torch.utils.data.Dataset):
    """Token ids of 8 for the first 6 samples fetched, then of 12: a new shape at step 3."""

    def __init__(self) -> None:
        self.fetched = 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.fetched += 1
        ids = torch.randint(0, 64, (8 if self.fetched <= 6 else 12,))
        return {"input_ids": ids, "labels": ids}


def test_a_torch_compile_recompile_is_the_models_forward_at_the_training_line(tmp_path: Path) -> None:
    from profcallbacks.hf import ProfilerCallback

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    callback = ProfilerCallback(schedule=None, sync_audit=False, memory=None, stall=None,
                                slowdown=None, tensorboard_scalars=False, watch_capture_file=False)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=5, per_device_train_batch_size=2, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", torch_compile=True,
        torch_compile_backend="aot_eager", dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Lengths(),
                                   callbacks=[callback])
    trainer.train()  # the training line
    recompiles = [f for f in callback.session.findings if f.kind == RECOMPILE]
    assert not [f.details["function"] for f in recompiles if f.details["decorator"]]
    [forward] = [f for f in recompiles if f.details["function"] == "forward"]
    source = inspect.unwrap(transformers.GPT2LMHeadModel.forward)
    assert forward.details["file"] == inspect.getsourcefile(source)
    assert forward.details["line"] == inspect.getsourcelines(source)[1]
    assert forward.step == 3 and "recompiled GPT2LMHeadModel.forward()" in forward.message
    assert [t.split("(")[0] for t in forward.details["through"]][:2] == ["wrapper", "wrapped_func"]
    assert forward.message.index("GPT2LMHeadModel.forward()") < forward.message.index("wrapper()")
    line = next(k for k, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.strip().endswith("# the training line"))
    assert (forward.details["call_file"], forward.details["call_line"]) == (__file__, line)
