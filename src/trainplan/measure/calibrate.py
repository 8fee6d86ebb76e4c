"""Per-accelerator step-time correction from measured runs: fitted and stored here, applied by the
prediction core (predict/calibration.py), which gets it as an argument (`user_calibration`).

The step-time model (timing.py) has one set of fitted efficiencies for every accelerator. A
machine the user measured can do better: for each accelerator with records,

    factor = median over records of  measured step_time_s / predicted device_step_time_s

(the median of ratios is robust to one odd run: a cold cache, another process on the GPU).
`device_step_time_s` is the prediction without communication and data wait, which a one-device
run on synthetic inputs does not have. The factor then scales the device-side terms of every
prediction for that accelerator only:

    step' = step + (factor - 1) x (step - communication - data_wait)

throughput scales by step / step' and MFU with it. Communication and data wait are not measured
and stay as predicted. The calibrated StepTime carries `calibration` = {step_time_factor,
measurements, first, last, ...}, which `estimate.to_json` emits and every report states.

The calibration file is `$TRAINPLAN_HOME/calibration.json`, schema "trainplan.calibration/1":
{"schema", "updated", "accelerators": {id: {step_time_factor, measurements, first, last,
ratio_min, ratio_max, ratios, records}}}.
"""
from __future__ import annotations

import functools
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import TrainplanError
from ..paths import atomic_write, trainplan_home
from ..predict.calibration import UNMEASURED_TERMS  # noqa: F401  (re-exported for measure/)
from .records import now_iso

SCHEMA = "trainplan.calibration/1"


@dataclass(frozen=True)
class Calibration:
    accelerator: str
    step_time_factor: float        # median measured / predicted device step time
    measurements: int
    first: str                     # date of the oldest record used (YYYY-MM-DD)
    last: str                      # date of the newest
    ratio_min: float
    ratio_max: float
    ratios: tuple[float, ...] = field(default=())
    records: tuple[str, ...] = field(default=())   # the files the records came from

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratios"], d["records"] = list(self.ratios), list(self.records)
        return d


def calibration_path() -> Path:
    return trainplan_home() / "calibration.json"


def usable(rec: dict) -> tuple[bool, str]:
    """Can this record calibrate? (yes/no, why not)."""
    pred, meas = rec.get("predicted"), rec.get("measured") or {}
    if not rec.get("accelerator"):
        return False, "no catalog accelerator (re-run with --accelerator ID)"
    if not pred or not pred.get("device_step_time_s"):
        return False, "no prediction (the job could not be traced)"
    if not meas.get("step_time_s"):
        return False, "no measured step time"
    algorithm = (rec.get("job") or {}).get("algorithm") or "sft"
    if algorithm != "sft":
        # a calibration scales the training step's time (predict/evaluate.py, before the
        # algorithm's phases are added); a whole GRPO/DPO/PPO step's ratio mixes in its
        # generation and reference forwards, which that factor does not apply to
        return False, (f"a whole --algorithm {algorithm} step (TrainplanCallback); calibrate "
                       "reads training steps, and generation from `measure --task generate`")
    return True, ""


GENERATE = ":generate"      # key suffix of a generation calibration ("h200:generate")


def key(rec: dict) -> str:
    """What a record calibrates: its accelerator's training steps, or its generation
    (`measure --task generate` records: "<accelerator>:generate"), never both."""
    return rec["accelerator"] + (GENERATE if rec["source"] == "measure-generate" else "")


def fit(records: list[dict], sources: tuple[str, ...] = ()) -> dict[str, Calibration]:
    """One Calibration per accelerator (and per accelerator's generation) found in `records`
    (those without a prediction skipped)."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        if usable(rec)[0]:
            groups.setdefault(key(rec), []).append(rec)
    out = {}
    for acc, recs in sorted(groups.items()):
        ratios = [r["measured"]["step_time_s"] / r["predicted"]["device_step_time_s"]
                  for r in recs]
        dates = sorted(r["timestamp"][:10] for r in recs)
        out[acc] = Calibration(acc, float(statistics.median(ratios)), len(recs), dates[0],
                               dates[-1], min(ratios), max(ratios),
                               tuple(round(x, 6) for x in ratios), tuple(sources))
    return out


def save(cals: dict[str, Calibration], path: str | Path | None = None,
         merge: bool = True) -> tuple[Path, list[str]]:
    """Write `cals`; with `merge`, accelerators not in `cals` keep their earlier calibration.
    Returns (path, ids kept from before)."""
    path = Path(path) if path else calibration_path()
    old = load(path) if merge and path.exists() else {}
    kept = sorted(set(old) - set(cals))
    merged = {**{k: old[k] for k in kept}, **cals}
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": SCHEMA, "updated": now_iso(),
           "accelerators": {k: v.to_dict() for k, v in sorted(merged.items())}}
    atomic_write(path, json.dumps(doc, indent=2) + "\n")
    return path, kept


def load(path: str | Path | None = None) -> dict[str, Calibration]:
    """The stored calibrations by accelerator id ({} when there is no file)."""
    path = Path(path) if path else calibration_path()
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    return dict(_load(str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int, _size: int) -> tuple[tuple[str, Calibration], ...]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}, expected {SCHEMA!r}")
        items = []
        for acc, d in doc["accelerators"].items():
            d = dict(d, ratios=tuple(d.get("ratios", ())), records=tuple(d.get("records", ())))
            items.append((acc, Calibration(**d)))
        return tuple(items)
    except (ValueError, KeyError, TypeError) as e:   # json.JSONDecodeError is a ValueError
        raise TrainplanError(f"Calibration file {path} is not valid: {e}.",
                             fix="run `trainplan calibrate --reset`, then `trainplan calibrate`"
                             ) from None


def reset(path: str | Path | None = None) -> Path | None:
    """Delete the calibration file; returns its path if there was one."""
    path = Path(path) if path else calibration_path()
    if path.exists():
        path.unlink()
        return path
    return None


def user_calibration(path: str | Path | None = None):
    """The stored factors as the prediction core's `Calibration` (predict/calibration.py), which
    the CLI passes to every prediction; the bundled time model alone when there is no file."""
    from ..predict.calibration import Calibration, StepTimeFactor
    where = str(Path(path) if path else calibration_path())
    factors = {acc: StepTimeFactor(acc, c.step_time_factor, c.measurements, c.first, c.last, where)
               for acc, c in load(path).items()}
    return Calibration(factors=factors)
