"""Library lines known to synchronise, what they are, and how to avoid them."""

from __future__ import annotations

import linecache
import os

# Known library sites: (path fragment, words within 3 lines of the site, what it is and the fix)
KNOWN_FIXES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("transformers/trainer.py", ("isnan", "isinf", "logging_nan_inf_filter"),
     "the Trainer's NaN/Inf check of each loss: TrainingArguments(logging_nan_inf_filter=False) "
     "removes it"),
    ("transformers/masking_utils.py", (".all()",),
     "transformers checks whether the attention mask has padding: batches without padding "
     "could pass attention_mask=None"),
    ("lightning/fabric/utilities/apply_func.py", ("item",),
     "Lightning turns logged tensors into numbers for the progress bar and loggers: "
     "self.log(..., prog_bar=False), on_step=False, or a larger Trainer(log_every_n_steps=...)"),
    ("lightning/pytorch/callbacks/progress", ("item",),
     "the progress bar reads self.log(..., prog_bar=True) values every step: log them with "
     "prog_bar=False"),
    ("torch/nn/modules/transformer.py", ("causal_comparison",),
     "nn.TransformerEncoder/TransformerDecoder called with a mask and is_causal=None compares the "
     "mask with a causal one on the host at every forward: pass is_causal=True with a causal mask "
     "(is_causal=False with any other)"),
    ("torch/nn/utils/clip_grad.py", ("error_if_nonfinite", "isnan", "isinf"),
     "clip_grad_norm_(..., error_if_nonfinite=True) checks the norm on the host: keep it False"),
)


OP_FIXES: dict[str, str] = {
    "repeat_interleave": "pass output_size= (the result's length, when known) and nothing is read "
                         "back",
    "nonzero": "a mask kept on the device (torch.where(mask, x, 0)), or torch.nonzero_static",
    "masked_select": "torch.where(mask, x, 0) keeps the shape and the device",
    "boolean mask indexing": "torch.where(mask, x, 0) keeps the shape and the device",
}
"""What to do instead of a data-dependent op whose result's size is read back."""


def op_fix(op: str) -> str | None:
    """The fix for a sync op in the user's own code (``None``: keep the value on the device)."""
    return next((OP_FIXES[o] for o in op.split(", ") if o in OP_FIXES), None)


def known_fix(location: str) -> str | None:
    """What a library sync site is and how to avoid it, for the sites in ``KNOWN_FIXES``."""
    path, _, line = location.rpartition(":")
    norm = path.replace(os.sep, "/")
    for fragment, words, fix in KNOWN_FIXES:
        if fragment in norm and line.isdigit():
            n = int(line)  # a multi-line statement reports its first line: look around it
            text = "".join(linecache.getline(path, i) for i in range(max(1, n - 3), n + 4))
            if any(w in text for w in words):
                return fix
    return None
