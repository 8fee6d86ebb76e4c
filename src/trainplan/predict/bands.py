"""The error a fit verdict carries: how far the memory prediction fell short on validated runs
like the job, and how sure a verdict built on it is.

`data/fit_bands.json` is written by `scripts/fit_bands.py` from the validation's numeric rows
(`validation/results/memory_rows.json`, written by `scripts/validate_memory.py`); nothing in it is
typed by hand. Each row gives the shortfall of the prediction on one real run,

    e = measured / predicted - 1        (> 0: the run needed more than predicted)

and the rows are grouped by regime (what changes how memory is laid out) and device class:

    regime    offload   (DeepSpeed CPU offload)        device    consumer    (GeForce, TITAN)
              sharded   (FSDP, ZeRO)                   class     datacenter  (other GPUs)
                                                                 tpu
              moe       (mixture-of-experts layers)
              qlora     (quantised base weights)
              lora      (adapters on a frozen base)
              plain     (everything else)

The band of a cell is the 95th percentile of its shortfalls, never below 0 (a regime the model
over-predicts gets no credit for it). Which cell a job takes (`band_for`):

    the (regime, class) cell                 where it holds at least MIN_ROWS rows
    the regime's band over every class       where the regime has MIN_ROWS rows and the class
                                             has validated rows of any regime
    the larger of the regime's and the       otherwise: a regime or a device class the
    pooled band (every row)                  validation has too few runs of

MIN_ROWS (data/fit_bands.json `min_rows`, scripts/fit_bands.py) is 19: a new run's shortfall
exceeds every one of n validated runs' with probability 1 / (n + 1), so fewer than 19 runs
cannot bound its 95th percentile from their own spread.

The verdict (memory.py): with `held` what the device holds with room (context + reserved) and
`overhead` the CUDA context, the band adds e x (held - overhead): the error is the allocator's,
not the context's. FITS where held plus the band fits the capacity; TIGHT where the step fits
on paper but the band crosses the capacity; DOES NOT FIT where the step does not fit at all.
`fit_probability` is the share of the cell's runs whose shortfall, applied to this job, would
still fit: the probability the verdict rests on, read off the validation (with few rows, coarse).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

REGIMES = ("plain", "lora", "qlora", "sharded", "offload", "moe")
DEVICE_CLASSES = ("datacenter", "consumer", "tpu")
CONSUMER_PREFIXES = ("rtx-", "titan-")      # GeForce and TITAN ids in data/accelerators.csv


@dataclass(frozen=True)
class Band:
    """One verdict band: the shortfall it allows and what it was read from."""

    regime: str
    device_class: str
    p95: float                      # 95th percentile of the shortfall, >= 0
    rows: int                       # validated runs it rests on
    errors: tuple[float, ...]       # their shortfalls (for the probability)
    basis: str                      # which cell: "qlora runs on datacenter GPUs", ...
    as_of: str

    def to_json(self) -> dict:
        return {"regime": self.regime, "device_class": self.device_class, "p95": self.p95,
                "rows": self.rows, "basis": self.basis, "as_of": self.as_of,
                "source": "data/fit_bands.json (scripts/fit_bands.py)"}

    @property
    def label(self) -> str:
        """'+6.3% (qlora runs, 5 validated)' for reports."""
        return f"+{self.p95:.1%} ({self.basis}, {self.rows} validated runs)"


CLASS_WORDS = {"datacenter": "datacenter GPUs", "consumer": "consumer GPUs", "tpu": "TPUs"}


def regime(job, moe: bool = False) -> str:
    """The job's regime (module docstring), most specific first."""
    if job.offload != "none":
        return "offload"
    if job.strategy.sharded:
        return "sharded"
    if moe:
        return "moe"
    if job.quantize.on:
        return "qlora"
    if job.lora is not None:
        return "lora"
    return "plain"


def device_class(accel) -> str:
    """consumer (GeForce and TITAN ids), tpu, or datacenter (other GPUs)."""
    if getattr(accel, "kind", "gpu") == "tpu":
        return "tpu"
    accel_id = getattr(accel, "id", accel)
    return "consumer" if accel_id.startswith(CONSUMER_PREFIXES) else "datacenter"


EMPTY = {"as_of": "none", "min_rows": 3, "pooled": {"rows": 0, "p95": 0.0, "errors": []},
         "regimes": {}, "cells": {}}


@functools.cache
def table() -> dict:
    """data/fit_bands.json (EMPTY only while scripts/validate_memory.py writes it the first
    time: every band 0)."""
    f = resources.files("trainplan") / "data" / "fit_bands.json"
    return json.loads(f.read_text()) if f.is_file() else EMPTY


def reload() -> None:
    """Forget the loaded table (scripts/validate_memory.py rewrites it mid-run)."""
    table.cache_clear()
    band_for_ids.cache_clear()


def band_for(job, accel, moe: bool = False) -> Band:
    return band_for_ids(regime(job, moe), device_class(accel))


@functools.cache
def band_for_ids(reg: str, cls: str) -> Band:
    """The band of regime `reg` on device class `cls` (module docstring)."""
    t = table()
    need = int(t["min_rows"])
    cells = t["cells"]
    cell = cells.get(reg, {}).get(cls, {"errors": []})
    whole = t["regimes"].get(reg, {"errors": []})
    class_rows = sum(len(cells.get(r, {}).get(cls, {"errors": []})["errors"]) for r in cells)
    where = CLASS_WORDS.get(cls, cls)
    if len(cell["errors"]) >= need:
        chosen, basis = cell, f"{reg} runs on {where}"
    elif len(whole["errors"]) >= need and class_rows:
        chosen, basis = whole, f"{reg} runs, every device class"
    else:
        pooled = t["pooled"]
        chosen, basis = (whole, f"{reg} runs") if whole["errors"] and \
            whole["p95"] >= pooled["p95"] else (pooled, f"pooled: fewer than {need} "
                                                f"{reg} runs on {where}")
    return Band(reg, cls, max(0.0, float(chosen["p95"])), len(chosen["errors"]),
                tuple(float(e) for e in chosen["errors"]), basis, t["as_of"])


def banded(held: int, overhead: int, band: Band) -> int:
    """What the device holds with room, plus the band on the allocator's part."""
    return held + int(band.p95 * max(0, held - overhead))


def fit_probability(held: int, overhead: int, capacity: int, band: Band) -> float:
    """The share of the band's validated runs whose shortfall, applied to `held`, still fits
    `capacity` (with no rows: 1 or 0 on the point estimate)."""
    if not band.errors:
        return 1.0 if held <= capacity else 0.0
    part = max(0, held - overhead)
    ok = sum(held + max(-1.0, e) * part <= capacity for e in band.errors)
    return ok / len(band.errors)
