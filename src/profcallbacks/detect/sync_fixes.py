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
    ("torch/nn/utils/clip_grad.py", ("error_if_nonfinite", "isnan", "isinf"),
     "clip_grad_norm_(..., error_if_nonfinite=True) checks the norm on the host: keep it False"),
)


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
