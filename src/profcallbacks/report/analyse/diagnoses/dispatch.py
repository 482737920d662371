"""``dispatch_bound``: a CPU step made of many tiny operators, where dispatch, not arithmetic, is the time.

Trigger (CPU-only traces, steady part): at least ``MIN_OPS`` top-level operators per step (those
no other operator encloses), a median start-to-start time between them under ``TINY_US`` (each
does next to no arithmetic: small tensors), and their dispatch (count x that median) at least
``DISPATCH_SHARE`` of the step; no compiled region in the step (``Torch-Compiled Region``,
``CompiledFunction``).

Gain: what compiling the step removes (``whatif.per_op_us``): every top-level operator's host cost
(the dispatcher and the Python between two operators) but one call of the compiled graph. The
compiled code still does the arithmetic, which on such tensors is a small part of each operator.

Negative case: a step of a few large matrix multiplications (each operator's time is its
arithmetic; the median start-to-start is milliseconds).
"""

from __future__ import annotations

from array import array
from itertools import islice
from operator import le

from profcallbacks.core.trace_names import COMPILED_PREFIXES
from profcallbacks.report.analyse.diagnoses.model import Capture, Diagnosis
from profcallbacks.report.analyse.diagnoses.whatif import start_to_start_us

MIN_OPS = 100
TINY_US = 40.0
DISPATCH_SHARE = 0.05


def dispatch_bound(cap: Capture) -> Diagnosis | None:
    """See the module docstring."""
    if not cap.cpu_only:
        return None
    ops = cap.ops
    name_col, parent_col, ts_col, end_col = ops.name, ops.parent, ops.ts, ops.end
    compiled = ops.name_ids(lambda n: n.startswith(COMPILED_PREFIXES))
    aten = ops.name_ids(lambda n: n.startswith("aten::"))
    kind_of: dict[int, int] = {}  # chain of parents -> _COMPILED, _UNDER_ATEN or 0
    starts, ends = array("d"), array("d")
    counted: dict[int, int] = {}
    for i in cap.rows_in_steps():  # the steady rows, read once: the top-level aten operators
        n, c = name_col[i], parent_col[i]
        kind = kind_of.get(c)
        if kind is None:
            kind = kind_of[c] = _kind(ops.chains[c])
        if n in compiled or kind == _COMPILED:
            return None
        if n in aten and kind != _UNDER_ATEN:
            starts.append(ts_col[i])
            ends.append(end_col[i])
            counted[n] = counted.get(n, 0) + 1
    top = len(starts)
    per_step = top / cap.n_steps
    if per_step < MIN_OPS:
        return None
    if not all(map(le, starts, islice(starts, 1, None))):
        order = sorted(range(top), key=starts.__getitem__)
        starts, ends = array("d", map(starts.__getitem__, order)), array("d", map(ends.__getitem__, order))
    each = start_to_start_us(starts, ends)
    step_us = cap.step_ms() * 1e3
    if each >= TINY_US or step_us <= 0:
        return None
    calls = cap.n_steps  # one compiled call per step is left
    saved = max(top - calls, 0) * each
    if saved / cap.n_steps < DISPATCH_SHARE * step_us:
        return None
    gain, share = cap.per_step(saved)
    basis = (f"~{gain:.2f} ms: {per_step:.0f} operators per step x {each:.1f} us host cost each "
             "(start to next start, median), all but one compiled call")
    common = sorted(((ops.names[n], c) for n, c in counted.items()), key=lambda kv: -kv[1])[:3]
    return Diagnosis(kind="dispatch_bound",
                     what="the step is many tiny operators: their dispatch, not their arithmetic, "
                          "is the time",
                     evidence=[f"{per_step:.0f} operators per step, a median {each:.1f} us apart; "
                               "most common: " + ", ".join(f"{n} x{c // cap.n_steps}"
                                                           for n, c in common), basis],
                     where=None, gain_ms=gain, gain_share=share,
                     fix=["torch.compile(model) (or the step's function): one compiled call "
                          "instead of an operator dispatch for each small op; batch small "
                          "tensors together where the model allows."],
                     details={"basis": basis})


_COMPILED, _UNDER_ATEN = 2, 1


def _kind(chain: tuple[str, ...]) -> int:
    """What a chain of enclosing operators says of those inside: a compiled region, an aten
    operator (its insides are not top-level), or neither (0)."""
    if any(p.startswith(COMPILED_PREFIXES) for p in chain):
        return _COMPILED
    return _UNDER_ATEN if any(p.startswith("aten::") for p in chain) else 0
