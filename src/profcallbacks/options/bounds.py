"""Bounds that several options share."""

from __future__ import annotations

from profcallbacks.options.checks import check_int

MAX_CAPTURE_STEPS = 1000
"""Most steps one capture window records: a trace of more steps is too large to open (a
5-step window of a small transformer is ~7 MB of JSON), and the window's events stay in memory
until it ends."""


def check_capture_steps(steps: int | None) -> None:
    """Reject a bad ``capture(steps=...)`` at the call, whichever front end took it."""
    if steps is not None:
        check_int("capture", "steps", steps, minimum=1, maximum=MAX_CAPTURE_STEPS,
                  fix="Use e.g. capture(steps=5), or capture() for the configured capture_steps.")


MAX_SUMMARY_STEPS = 1000
"""A summary covers at most this many steps, whatever ``log_every_n_steps`` is (bounded memory)."""
SUMMARY_MIN_S = 0.2
"""With ``log_every_n_steps=None``, a summary covers at least this much step time (up to
:data:`MAX_SUMMARY_STEPS` steps): steps shorter than 4 ms are summarised more than 50 at a time.
Each summary costs ~150 us between training steps (the TensorBoard record, the steps-file row),
~3 us per 0.25 ms step if written every 50 steps; five a second cost ~0.08%, and a one-second
CI run still has the five summaries ``compare --fail-if-slower`` needs."""
