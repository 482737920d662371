"""A trace's events as slim records holding only the fields the report reads.

Parsing a 110 MB trace into dicts makes ~10 million objects, most of them the ``args`` of CPU
operators (shapes, strides, concrete inputs) that the report never looks at; building and freeing
them took longer than all of the analysis. With msgspec (a dependency of profcallbacks) the
JSON is decoded straight into ``Event`` records, skipping every other field: 4x faster to parse
(0.26 s against orjson's 0.95 s here) and 8x faster to free. For a trace msgspec refuses, the
file is parsed into dicts (orjson or json) and converted record by record, so both ways give the
same records.

A missing field is ``MISSING`` (not ``None``: a ``"dur": null`` is a fault, a missing ``dur`` is
not); an event that is not a JSON object stays what it was (a number, string, list or ``None``),
and so does ``args`` that is not an object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from profcallbacks.report.read.files import ReadError, parse_json, read_bytes

try:
    import msgspec

    MISSING: Any = msgspec.UNSET
    """The value of a field the event does not have."""

    class Args(msgspec.Struct, gc=False):
        """The ``args`` keys the report reads (operator shapes left undecoded until read)."""

        stream: Any = -1
        correlation: Any = -1
        profcallbacks: Any = None
        flops: Any = None
        dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")
        concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Concrete Inputs")

    class Event(msgspec.Struct, gc=False):
        """One trace event: the fields the report reads (``MISSING`` when absent)."""

        ph: Any = MISSING
        cat: Any = MISSING
        name: Any = MISSING
        pid: Any = MISSING
        tid: Any = MISSING
        ts: Any = MISSING
        dur: Any = MISSING
        args: Args | list[Any] | str | int | float | bool | None | msgspec.UnsetType = MISSING

    class Trace(msgspec.Struct, gc=False):
        """A Chrome trace: its events and the blocks the report reads."""

        traceEvents: list[Event | list[Any] | str | int | float | bool | None]
        profcallbacks: Any = None
        distributedInfo: Any = None
        deviceProperties: Any = None

    _decoder: Any = msgspec.json.Decoder(Trace)
    _batch_decoder: Any = msgspec.json.Decoder(
        list[Event | list[Any] | str | int | float | bool | None])
    _DECODE_ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError)
    DECODER = "msgspec"
    _RAW: Any = msgspec.Raw
except ImportError:  # pragma: no cover - exercised where msgspec is absent
    _decoder = None
    _batch_decoder = None
    _DECODE_ERRORS = ()
    DECODER = "dicts"
    _RAW = None
    MISSING = type("Missing", (), {"__slots__": (), "__repr__": lambda self: "MISSING"})()

    class Args:  # type: ignore[no-redef]
        """The ``args`` keys the report reads."""

        __slots__ = ("stream", "correlation", "profcallbacks", "flops", "dims", "concrete")

        def __init__(self, stream: Any = -1, correlation: Any = -1, profcallbacks: Any = None,
                     flops: Any = None, dims: Any = None, concrete: Any = None) -> None:
            self.stream, self.correlation, self.profcallbacks = stream, correlation, profcallbacks
            self.flops, self.dims, self.concrete = flops, dims, concrete

    class Event:  # type: ignore[no-redef]
        """One trace event: the fields the report reads (``MISSING`` when absent)."""

        __slots__ = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")

        def __init__(self, ph: Any = MISSING, cat: Any = MISSING, name: Any = MISSING,
                     pid: Any = MISSING, tid: Any = MISSING, ts: Any = MISSING, dur: Any = MISSING,
                     args: Any = MISSING) -> None:
            self.ph, self.cat, self.name, self.pid = ph, cat, name, pid
            self.tid, self.ts, self.dur, self.args = tid, ts, dur, args

    class Trace:  # type: ignore[no-redef]
        """A Chrome trace: its events and the blocks the report reads."""

        __slots__ = ("traceEvents", "profcallbacks", "distributedInfo", "deviceProperties")

        def __init__(self, traceEvents: list[Any], profcallbacks: Any = None,  # noqa: N803
                     distributedInfo: Any = None, deviceProperties: Any = None) -> None:  # noqa: N803
            self.traceEvents, self.profcallbacks = traceEvents, profcallbacks
            self.distributedInfo, self.deviceProperties = distributedInfo, deviceProperties

def _raw(value: Any) -> Any:
    """``value`` as ``Args.dims``/``concrete`` hold it: undecoded JSON (``msgspec.Raw``) where
    msgspec decodes, the parsed value otherwise (``shape_value`` reads both)."""
    if _RAW is None:
        return value
    return _RAW(msgspec.json.encode(value))


def shape_value(value: Any) -> Any:
    """The parsed ``Input Dims``/``Concrete Inputs`` of an ``Args`` (None when absent or bad)."""
    if _RAW is not None and isinstance(value, _RAW):
        try:
            return msgspec.json.decode(value)
        except msgspec.DecodeError:
            return None
    return value


def _event(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    get = value.get
    args = get("args", MISSING)
    if isinstance(args, dict):
        args = Args(args.get("stream", -1), args.get("correlation", -1), args.get("profcallbacks"),
                    args.get("flops"), _raw(args.get("Input Dims")), _raw(args.get("Concrete Inputs")))
    return Event(get("ph", MISSING), get("cat", MISSING), get("name", MISSING), get("pid", MISSING),
                 get("tid", MISSING), get("ts", MISSING), get("dur", MISSING), args)


def slim(trace: Any, path: Path) -> Trace:
    """The ``Trace`` of a trace parsed into dicts (e.g. by ``read_json``).

    Raises:
        ReadError: ``trace`` is not a Chrome trace (no ``traceEvents`` list).
    """
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ReadError(path, "not a Chrome trace (no traceEvents list)")
    return Trace(traceEvents=[_event(e) for e in trace["traceEvents"]],
                 profcallbacks=trace.get("profcallbacks"), distributedInfo=trace.get("distributedInfo"),
                 deviceProperties=trace.get("deviceProperties"))


def load_trace(path: Path) -> Trace:
    """Reads ``path`` (gzipped or not) into a ``Trace``.

    Raises:
        ReadError: The file cannot be read or is not a Chrome trace.
    """
    return decode_trace(read_bytes(path), path)


def decode_trace(data: bytes | bytearray, path: Path) -> Trace:
    """The ``Trace`` of ``data``, the JSON of a trace (``path`` names it in errors).

    Raises:
        ReadError: ``data`` is not a Chrome trace.
    """
    if _decoder is not None:
        try:
            return _decoder.decode(data)
        except _DECODE_ERRORS:  # not a trace, or something msgspec refuses: the dict path says why
            pass
    return slim(parse_json(path, data), path)


def decode_events(part: bytes | bytearray | memoryview) -> list[Any] | None:
    """The events of ``part``, a run of whole events cut from a ``traceEvents`` array (without
    its brackets); ``None`` when the cut fell inside an event."""
    data = b"".join((b"[", part, b"]"))  # one copy, whatever ``part`` is
    if _batch_decoder is not None:
        try:
            events: list[Any] = _batch_decoder.decode(data)
            return events
        except _DECODE_ERRORS:
            pass
    try:
        return [_event(e) for e in json.loads(data)]
    except (ValueError, RecursionError):
        return None
