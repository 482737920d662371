"""Triggered captures agreed across ranks, so every rank records the same steps."""

from __future__ import annotations

import datetime
import logging

import torch

from profcallbacks.core.triggers import (
    BASELINE,
    FILE,
    MANUAL,
    MEMORY,
    SLOWDOWN,
    VALIDATION,
    CaptureRequest,
)

log = logging.getLogger(__name__)

TRIGGER_CODES = {MANUAL: 1, FILE: 2, SLOWDOWN: 3, BASELINE: 4, MEMORY: 5, VALIDATION: 6}
"""Every trigger a request can carry across ranks (an unknown code falls back to manual)."""
_TRIGGERS = {code: name for name, code in TRIGGER_CODES.items()}


class TriggerAgreement:
    """Holds this rank's capture requests and shares them with all ranks every ``every`` steps.

    Scheduled windows need no talking (they depend on the step number alone). A request made on
    any rank (``capture()``, the CAPTURE file, a slowdown alert) is held until the next step that
    is a multiple of ``every``; there every rank calls one ``all_reduce`` (MAX) of two integers on
    the existing default process group, and all ranks open the same window at the same step.
    Cost: one tiny collective on a CPU (gloo) group every ``every`` steps, never per step, and
    no host-device sync. Every rank must run the profiler (as every rank runs DDP): create it on
    all ranks and choose the tracing ones with ``ranks=``.

    Example:
        >>> import torch.distributed as dist
        >>> store = f"file://{getfixture('tmp_path')}/store"
        >>> dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
        >>> agreement = TriggerAgreement(every=50)
        >>> agreement.hold(CaptureRequest(FILE, steps=5))
        >>> agreement.exchange()  # at steps 0, 50, 100...: the request every rank agreed on
        CaptureRequest(trigger='file', steps=5, profile_memory=False)
        >>> agreement.exchange() is None  # nobody asked since
        True
        >>> dist.destroy_process_group()
    """

    def __init__(self, every: int, *, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        self.every = every
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._held: CaptureRequest | None = None
        self.enabled = True
        # A CPU group even under NCCL: reading a CUDA result back would be a host-device sync.
        # Creating it is a collective too, so every rank does it here, when profiling opens.
        self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None

    def hold(self, request: CaptureRequest) -> None:
        """Keep ``request`` (its ``steps`` given) for the next exchange; the longest one wins."""
        if self._held is None or (request.steps or 0) > (self._held.steps or 0):
            self._held = request

    def exchange(self) -> CaptureRequest | None:
        """The request agreed by all ranks (None: nobody asked). Call on every rank at once."""
        import torch.distributed as dist

        held, self._held = self._held, None
        code = TRIGGER_CODES.get(held.trigger, 1) if held else 0
        values = torch.tensor([held.steps or 0, code, held.profile_memory] if held else [0, 0, 0],
                              dtype=torch.int64)
        try:
            work = dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self._group,
                                   async_op=True)
            if work is not None:
                work.wait(self._timeout)
            active, code, memory = (int(v) for v in values.tolist())
        except Exception as exc:  # a rank has gone (stopped early or crashed): stop agreeing
            log.warning("profcallbacks: could not agree on captures with the other ranks (%s); "
                        "requested captures are now per rank.", exc)
            self.enabled = False
            return held
        return CaptureRequest(_TRIGGERS.get(code, MANUAL), active, bool(memory)) if active else None
