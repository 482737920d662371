"""Read back what W&B (offline mode), MLflow (a local SQLite store) and CSVLogger wrote."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row of the offline run in ``run_dir``, from its ``run-*.wandb`` file."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
             for item in record.history.item} for record in wandb_records(run_dir, "history")]


def wandb_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary as its last summary records left it."""
    out: dict[str, Any] = {}
    for record in wandb_records(run_dir, "summary"):
        for item in record.summary.update:
            out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def wandb_artifacts(run_dir: Path) -> list[dict[str, Any]]:
    """The artifacts the run logged: name, type, metadata and the names of their files."""
    return [{"name": r.artifact.name, "type": r.artifact.type,
             "metadata": json.loads(r.artifact.metadata or "{}"),
             "files": sorted(entry.path for entry in r.artifact.manifest.contents)}
            for r in wandb_records(run_dir, "artifact")]


def wandb_records(run_dir: Path, record_type: str) -> list[Any]:
    """The records of one kind (``history``, ``summary``, ``artifact`` ...) of the offline run."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, partial, pos = [], b"", 7
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind in (3, 4):
            partial += chunk
            if kind == 4:
                records.append(partial)
    out = []
    for payload in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == record_type:
            out.append(record)
    return out


def wandb_run_dir(root: Path) -> Path:
    (run_dir,) = (root / "wandb").glob("offline-run-*")
    return run_dir


def wandb_table(run_dir: Path, rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The last table logged under ``key``, read from the run's media files.

    wandb 0.19+ writes the table's fields as nested keys (``key/path``); older versions one
    ``key`` item holding them all.
    """
    paths = [row[f"{key}/path"] if f"{key}/path" in row else row[key]["path"]
             for row in rows if f"{key}/path" in row or isinstance(row.get(key), dict)]
    (path,) = paths[-1:]
    return json.loads((run_dir / "files" / path).read_text())


def series(rows: list[dict[str, Any]], key: str, step_key: str) -> list[tuple[int, float]]:
    """(step, value) of every row holding ``key``, in logging order."""
    return [(int(row[step_key]), row[key]) for row in rows if key in row and step_key in row]


def mlflow_metric(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def mlflow_findings(client: Any, run_id: str, dst: Path) -> list[dict[str, Any]]:
    dst.mkdir(parents=True, exist_ok=True)  # mlflow 2.10 refuses a destination that is missing
    path = client.download_artifacts(run_id, "profcallbacks/findings.jsonl", str(dst))
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def csv_rows(path: Path) -> list[dict[str, str]]:
    with Path(path).open() as f:
        return list(csv.DictReader(f))
