"""Measurement records: one JSON object per line, appended by `trainplan measure`, by
`trainplan.measure.record(...)` and by `TrainplanCallback`, read by `trainplan calibrate`.

Schema "trainplan.measurement/1" (units in key names; bytes, seconds):

    schema          "trainplan.measurement/1"
    timestamp       ISO 8601, UTC, of the end of the run
    source          "measure" (the CLI) | "record" (context manager) | "hf-trainer" (callback)
                    | "measure-generate" (`measure --task generate`: one generate call a step,
                    measured and predicted prefill_s and decode_token_s added; generate.py)
    command         the command line that ran
    job             the job as flat keys (the YAML / flag names): `job_from_dict` reads it back
    device          {type, index, name, total_memory_bytes, compute_capability, driver_version}
    accelerator     catalog id of that device, or null; accelerator_source: "flag" | "detected"
    versions        python, torch, cuda, cudnn, trainplan, transformers, timm, ... , platform
    settings        how it ran (warm-up and timed steps, precision switches, grad scaler, ...)
    measured        step_time_s (median of timed steps), step_time_mean_s, step_times_s,
                    samples_per_s, tokens_per_s, peak_allocated_bytes, peak_reserved_bytes,
                    device_used_bytes, device_used_source, peak_rss_bytes, rss_before_bytes,
                    loss_first, loss_last
    predicted       trainplan's uncalibrated prediction for `accelerator` (null without one):
                    step_time_s, device_step_time_s, samples_per_s, tokens_per_s, mfu,
                    peak_allocated_bytes, peak_reserved_bytes, device_used_bytes,
                    kernel_semantics, calibrated_step_time_s, calibration
    notes           what differs from the predicted job or could not be measured

Records live in `$TRAINPLAN_HOME/measurements.jsonl` (default ~/.local/share/trainplan).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..errors import TrainplanError
from ..paths import trainplan_home
from ..named import Named
from ..spec import Job, validate
from ..jobfile import job_from_dict

SCHEMA = "trainplan.measurement/1"
SOURCES = ("measure", "record", "hf-trainer", "measure-generate")
REQUIRED = {"schema": str, "timestamp": str, "source": str, "command": str, "job": dict,
            "device": dict, "versions": dict, "settings": dict, "measured": dict,
            "notes": list}
REQUIRED_MEASURED = ("step_time_s", "step_times_s", "samples_per_s", "peak_allocated_bytes",
                     "peak_reserved_bytes", "device_used_bytes", "peak_rss_bytes")
REQUIRED_PREDICTED = ("step_time_s", "device_step_time_s", "peak_allocated_bytes",
                      "peak_reserved_bytes", "device_used_bytes")


def default_records_path() -> Path:
    return trainplan_home() / "measurements.jsonl"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def job_to_dict(job: Job) -> dict:
    """The job as the flat keys `job_from_dict` reads. Every set value is written, defaults
    included, so a record still means the same job if a default changes; None and empty are left
    out."""
    out: dict = {}
    for f in fields(Job):
        if f.name in ("base_dir", "notes"):
            continue
        v = getattr(job, f.name)
        if v is None or v == ():
            continue
        if isinstance(v, Named):        # precision, strategy, quantisation: their canonical name
            v = v.name
        elif hasattr(v, "to_dict"):     # a block with its own file shape (campaign)
            v = v.to_dict()
        elif is_dataclass(v):
            v = asdict(v)
        elif isinstance(v, tuple):
            v = [dict(x) if isinstance(x, dict) else x for x in v]
        out[f.name] = v
    return out


def job_from_record(rec: dict) -> Job:
    base = rec.get("job_base_dir")
    return validate(job_from_dict(rec["job"], source="measurement record",
                                  base_dir=Path(base) if base else None))


def make_record(*, job: Job, source: str, command: str, device: dict, accelerator: str | None,
                accelerator_source: str | None, versions: dict, settings: dict, measured: dict,
                predicted: dict | None, notes: list[str]) -> dict:
    rec = {
        "schema": SCHEMA, "timestamp": now_iso(), "source": source, "command": command,
        "job": job_to_dict(job),
        "job_base_dir": str(job.base_dir) if job.base_dir else None,
        "device": device, "accelerator": accelerator, "accelerator_source": accelerator_source,
        "versions": versions, "settings": settings, "measured": measured,
        "predicted": predicted, "notes": list(notes),
    }
    return check_record(rec)


def check_record(rec: dict, where: str = "measurement record") -> dict:
    """Raise a TrainplanError naming the first thing wrong with `rec`; return it unchanged."""
    def bad(what: str) -> TrainplanError:
        return TrainplanError(f"{where}: {what}.",
                              fix="records are written by `trainplan measure`; do not edit them "
                                  "by hand, or delete the bad line")
    if not isinstance(rec, dict):
        raise bad("not a JSON object")
    if rec.get("schema") != SCHEMA:
        raise bad(f"schema is {rec.get('schema')!r}, expected {SCHEMA!r}")
    for k, typ in REQUIRED.items():
        if not isinstance(rec.get(k), typ):
            raise bad(f"{k!r} is missing or not a {typ.__name__}")
    if rec["source"] not in SOURCES:
        raise bad(f"source {rec['source']!r} is not one of {', '.join(SOURCES)}")
    try:
        datetime.fromisoformat(rec["timestamp"])
    except ValueError:
        raise bad(f"timestamp {rec['timestamp']!r} is not ISO 8601") from None
    if "model" not in rec["job"]:
        raise bad("job has no model")
    m = rec["measured"]
    for k in REQUIRED_MEASURED:
        if k not in m:
            raise bad(f"measured has no {k!r}")
    if not (isinstance(m["step_time_s"], (int, float)) and m["step_time_s"] > 0):
        raise bad(f"measured step_time_s {m['step_time_s']!r} is not a positive number")
    if not m["step_times_s"]:
        raise bad("measured step_times_s is empty")
    acc, pred = rec.get("accelerator"), rec.get("predicted")
    if pred is not None:
        if not acc:
            raise bad("predicted values without an accelerator")
        for k in REQUIRED_PREDICTED:
            if k not in pred:
                raise bad(f"predicted has no {k!r}")
    return rec


def check_records_file(path: str | Path | None = None) -> Path:
    """The file a record will be appended to, checked before a run: a folder, or a file whose
    first line is not a record (a JSON document, a CSV: the user named the wrong file), is an
    error; a new or empty file, or a file of records, is fine. Appending to another file would
    leave it neither what it was nor a records file."""
    path = Path(path).expanduser() if path else default_records_path()
    if path.is_dir():
        raise TrainplanError(f"--out {path} is a folder.",
                             fix=f"name a file in it: {path / 'measurements.jsonl'}")
    if not path.is_file() or path.stat().st_size == 0:
        return path
    with path.open(encoding="utf-8", errors="replace") as f:
        first = next((line for line in f if line.strip() and not _torn(line)), None)
    if first is None:            # only a record a killed run left half-written
        return path
    try:
        check_record(json.loads(first), f"{path} line 1")
    except (json.JSONDecodeError, TrainplanError, TypeError, AttributeError):
        raise TrainplanError(f"{path} is not a file of trainplan measurements; a record is "
                             "appended only to one (JSON lines, one record a line).",
                             fix="give --out a new file, or the records file of earlier runs"
                             ) from None
    return path


def _torn(line: str) -> bool:
    """A record a killed run left half-written: a JSON object's first key opened (a record is
    one line, `{"` first) and never closed. A pretty-printed JSON document's first line, `{`
    alone, is not one."""
    line = line.strip()
    return line.startswith('{"') and not line.endswith("}")


def append_record(rec: dict, path: str | Path | None = None) -> Path:
    """Append one record as one line, in one write, flushed to the disk: a crash leaves the
    file's earlier records as they were, and a write that fails (a full disk) is cut back off,
    leaving the file as it was. After a line an earlier crash left unfinished the new record
    starts a line of its own."""
    path = check_records_file(path)
    line = (json.dumps(check_record(rec), sort_keys=True) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    size = os.fstat(fd).st_size
    try:
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        if os.write(fd, line) != len(line):
            raise OSError(28, "No space left on device")
        os.fsync(fd)
    except OSError as e:
        os.ftruncate(fd, size)
        raise TrainplanError(f"cannot append the record to {path}: {e.strerror}; the file is "
                             "as it was.", fix="free space there, or give --out another file"
                             ) from None
    finally:
        os.close(fd)
    return path


def read_records(path: str | Path | None = None, skipped: list[str] | None = None) -> list[dict]:
    """All records of a JSON-lines file, each checked; a bad line is an error naming it. A line
    that opens a JSON object and never closes it is a record a killed run left half-written
    (`append_record` writes each record and its newline in one write, so only a kill inside
    that write leaves one; the next append starts a line of its own after it): it is left out,
    and said in `skipped` where given."""
    path = Path(path).expanduser() if path else default_records_path()
    if not path.exists():
        raise TrainplanError(f"No measurements at {path}.",
                             fix="run `trainplan measure JOB` on the machine first (or pass "
                                 "--records FILE)")
    out = []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if _torn(line):
                if skipped is not None:
                    skipped.append(f"{path} line {i}: a record left unfinished (its run was "
                                   "stopped while writing it)")
                continue
            raise TrainplanError(f"{path} line {i} is not JSON: {e.msg}.",
                                 fix="delete the broken line") from None
        out.append(check_record(rec, f"{path} line {i}"))
    return out
