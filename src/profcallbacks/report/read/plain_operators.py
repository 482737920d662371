"""The common CPU operator, read once for every part of a trace's model.

Most events of a trace are CPU operators (``cpu_op``) that no part of the model looks at closely:
not a step, loader, optimizer, collective or blocking call, not torch.compile's. Each part of the
model (``generations.Normaliser``, ``traces.Summariser``, ``events.Scanner``,
``capture_model.CaptureBuilder``) only counts such an operator or adds its times to columns.
Walking each piece of events once per part read every operator four times; here the piece is
walked once: a plain operator goes straight into the four parts' columns, and the events between
two plain operators (everything else, hostile ones included) go to each part's own ``add`` as a
run, before the next plain operator, so that every part sees its events in file order as before
(a thread's operators keep their order, and so the same nesting and self times). An operator
whose shapes give its FLOPs (``model/flops.py``) keeps its shapes for the capture model, as there.

An operator is plain once each part has seen its name and its thread the general way (the first
of each goes through the parts' ``add``): its start and duration are finite floats within range,
its ``args`` carry no ``flops``. A part that comes to treat some CPU operators on their own (a
new marker, a name whose arguments it reads) must make them not plain in :meth:`_plain_name`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from profcallbacks.core.trace_names import CPU_OP, MARKED_PREFIXES, SYNC_CALLS
from profcallbacks.report.model.flops import COUNTED
from profcallbacks.report.read.decode import _RAW, Args, Event

if TYPE_CHECKING:
    from profcallbacks.report.read.capture_model import CaptureBuilder
    from profcallbacks.report.read.events import Scanner
    from profcallbacks.report.read.generations import Normaliser


class Summary(Protocol):
    """What is taken of ``traces.Summariser`` (which imports this module): each thread's
    columns by ``(pid, tid)``, the operators' name ids, those of torch.compile's regions."""

    threads: dict[Any, Any]
    name_ids: dict[str, int]
    compiled_ids: set[int]


MAX_US = 1e17
"""About 3,000 years in microseconds: beyond it a timestamp is garbage (the summary's bound)."""
_PLAIN_KIND = 0  # generations.Normaliser's kind of a name that marks nothing


class PlainOperators:
    """Takes a piece's plain CPU operators into the parts' columns in one walk (see the module
    docstring); ``general`` takes the other events, run by run, in file order."""

    def __init__(self, normaliser: Normaliser, summariser: Summary, scanner: Scanner,
                 capture: CaptureBuilder) -> None:
        self.normaliser, self.summariser = normaliser, summariser
        self.scanner, self.capture = scanner, capture
        # name -> (its id in the summary, its id in the operator table, shapes give its FLOPs),
        # or None for a name that is never plain
        self._names: dict[str, tuple[int, int, bool] | None] = {}
        # (pid, tid) -> (the summary's columns of that thread, its id in the operator table)
        self._threads: dict[tuple[int, int], tuple[Any, int]] = {}

    def add(self, events: list[Any], general: Callable[[list[Any]], None], *,
            decoded: bool = False) -> int:
        """Takes ``events`` (a piece, in file order): plain operators here, the rest through
        ``general`` (each part's ``add``) as runs between them; returns how many were plain.
        ``decoded``: the piece is as decoded, not yet through the stream's filter: shapes
        kept are copied (``stream.py``: a ``msgspec.Raw`` is a view of the whole piece)."""
        names = self._names
        ops, shaped = self.capture.ops, self.capture.shaped.append
        put_ts, put_end, put_name, put_tid = ops.ts.append, ops.end.append, ops.name.append, ops.tid.append
        plain_ts, plain_dur = self.scanner.found.plain_ts.append, self.scanner.found.plain_dur.append
        fractional = self.normaliser.fractional
        taken = 0
        run = 0  # the first event not taken yet: events[run:i] go to ``general``
        last_pid: Any = None
        last_tid: Any = None
        thread: Any = None
        table_tid = -1
        for i, event in enumerate(events):
            if event.__class__ is not Event or event.cat != CPU_OP or event.ph != "X":
                continue
            ts, dur, name = event.ts, event.dur, event.name
            if (ts.__class__ is not float or dur.__class__ is not float
                    or name.__class__ is not str or not (-MAX_US < ts < MAX_US and 0.0 <= dur < MAX_US)):
                continue
            ids = names.get(name)
            if ids is None:
                if name in names:  # known not to be plain
                    continue
                ids = self._plain_name(name)
                if ids is None:  # not seen yet: the parts take it, and know it from now on
                    general(events[run:i + 1])
                    run = i + 1
                    continue
            pid, tid = event.pid, event.tid
            if pid != last_pid or tid != last_tid or pid.__class__ is not int or tid.__class__ is not int:
                known = self._thread(pid, tid)
                if known is None:  # a thread not seen yet, or not one of two ints
                    general(events[run:i + 1])
                    run = i + 1
                    continue
                (thread, table_tid), last_pid, last_tid = known, pid, tid
            args = event.args
            if args.__class__ is Args and args.flops is not None:
                continue
            if run < i:
                general(events[run:i])
                fractional = fractional or self.normaliser.fractional
            run = i + 1
            summary_id, table_id, counted = ids
            thread[0].append(ts)
            thread[1].append(dur)
            thread[2].append(summary_id)
            plain_ts(ts)
            plain_dur(dur)
            put_ts(ts)
            put_end(ts + dur)
            put_name(table_id)
            put_tid(table_tid)
            if counted and args.__class__ is Args:
                if decoded and _RAW is not None:
                    args.dims, args.concrete = args.dims.copy(), args.concrete.copy()
                shaped((len(ops) - 1, args))
            if not fractional and ts % 1:
                fractional = True
            taken += 1
        if run < len(events):
            general(events[run:] if run else events)
        normaliser = self.normaliser
        normaliser.fractional = fractional or normaliser.fractional
        if taken:
            normaliser.seen[CPU_OP] += taken
            normaliser.modern += taken
            normaliser.cpu_ops += taken
        return taken

    def _plain_name(self, name: str) -> tuple[int, int, bool] | None:
        """``name``'s ids in the summary and the operator table, and whether its shapes give
        FLOPs, if an operator of that name is plain; ``None`` (remembered) if it never is,
        ``None`` (not remembered) while a part has not seen it yet."""
        if (name in SYNC_CALLS or name.startswith(MARKED_PREFIXES)
                or self.normaliser.kinds.get(name, _PLAIN_KIND) != _PLAIN_KIND):
            self._names[name] = None
            return None
        summary_id = self.summariser.name_ids.get(name)
        table_id = self.capture.ops.id_of(name)
        if summary_id is None or table_id is None or name not in self.normaliser.kinds:
            return None  # seen the general way first
        if summary_id in self.summariser.compiled_ids:
            self._names[name] = None
            return None
        ids = self._names[name] = (summary_id, table_id, name in COUNTED)
        return ids

    def _thread(self, pid: Any, tid: Any) -> tuple[Any, int] | None:
        """The summary's columns and the operator table's id of the thread ``(pid, tid)`` once
        both have it; ``None`` for another kind of pid or tid, or before."""
        if pid.__class__ is not int or tid.__class__ is not int:
            return None
        key = (pid, tid)
        known = self._threads.get(key)
        if known is not None:
            return known
        thread = self.summariser.threads.get(key)
        table_key = self.capture.thread_keys.get(key)
        table_id = None if table_key is None else self.capture.ops.tid_ids.get(table_key)
        if thread is None or table_id is None:
            return None
        known = self._threads[key] = (thread, table_id)
        return known
