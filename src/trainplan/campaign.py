"""A campaign: many runs of one job (a count, a count per period, or a sweep), as a job file's
`campaign:` block or `plan --runs N [--per week|month|year]`.

    campaign:
      runs: 100                   # runs of each variant (default 1), each as the job plans it
      per: year                   # optional: the runs are one week's | month's | year's work
      sweep:                      # optional: a grid; every combination is a variant
        learning_rate: [1.0e-4, 3.0e-4, 1.0e-3]   # the plan does not depend on it: traced once
        seq_len: [512, 1024]                      # it does: each value planned (traces shared)
      electricity_usd_per_kwh: 0.25   # else the region's sourced price (data/ownership.json)
      region: eu                      # us (default) | eu
      hardware_usd: 300               # owned platforms: the machine's price (else the board's)
      lifetime_years: 3               # owned hardware's price spread over this many years

Sweep keys are of two kinds. PLAN_FREE: hyperparameters that change neither a step's work nor
its memory (learning rate, seed, weight decay, warm-up, schedule, the clipping norm: whether a
step clips at all is the job's `max_grad_norm`, planned for every variant): their variants are
the same plan, so they only multiply the runs. PLAN_KEYS: job settings that change the plan
(sequence length, micro-batch, accumulation, image size, steps, precision, optimizer, LoRA rank,
model): each variant is planned, sharing the trace cache. plan/campaign.py does the arithmetic.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass
from importlib import resources

from .errors import TrainplanError, unknown

DAY_S = 86400.0
PERIOD_S = {"week": 7 * DAY_S, "month": 365.25 / 12 * DAY_S, "year": 365.25 * DAY_S}
PLAN_FREE = ("learning_rate", "lr", "seed", "weight_decay", "warmup_steps", "warmup_ratio",
             "lr_scheduler", "max_grad_norm", "adam_beta1", "adam_beta2", "label_smoothing")
PLAN_KEYS = ("seq_len", "batch_size", "grad_accum", "image_size", "steps", "precision",
             "optimizer", "lora_rank", "model")
KEYS = ("runs", "per", "sweep", "electricity_usd_per_kwh", "region", "hardware_usd",
        "lifetime_years")
MAX_VARIANTS = 64            # planned variants (PLAN_KEYS combinations) in one campaign


@dataclass(frozen=True)
class CampaignSpec:
    runs: int = 1
    per: str | None = None                                  # week | month | year
    sweep: tuple[tuple[str, tuple], ...] = ()               # (key, values), in the file's order
    electricity_usd_per_kwh: float | None = None
    region: str | None = None
    hardware_usd: float | None = None
    lifetime_years: float | None = None

    @property
    def period_s(self) -> float | None:
        return PERIOD_S[self.per] if self.per else None

    @property
    def repeats(self) -> int:
        """Runs of each planned variant: runs x the plan-free grid."""
        return self.runs * math.prod(len(v) for k, v in self.sweep if k in PLAN_FREE)

    def variants(self) -> list[dict]:
        """The planned variants: every combination of the PLAN_KEYS values ([{}] without)."""
        keyed = [(k, v) for k, v in self.sweep if k in PLAN_KEYS]
        return [dict(zip([k for k, _ in keyed], combo))
                for combo in itertools.product(*[v for _, v in keyed])]

    @property
    def total_runs(self) -> int:
        return self.repeats * len(self.variants())

    def to_dict(self) -> dict:
        """The `campaign:` block that parses back to this spec (parse_campaign)."""
        out = {k: getattr(self, k) for k in KEYS if k != "sweep" and getattr(self, k) is not None}
        if self.sweep:
            out["sweep"] = {k: list(v) for k, v in self.sweep}
        return out


@functools.cache
def ownership() -> dict:
    """data/ownership.json: launch prices, electricity by region, the default lifetime."""
    return json.loads(resources.files("trainplan.data").joinpath("ownership.json").read_text())


def _number(where: str, key: str, v, positive: bool = True):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        v > 0 if positive else v >= 0)
    if not ok:
        raise TrainplanError(f"{where}: campaign {key} must be a number "
                             f"{'> 0' if positive else '>= 0'}, got {v!r}.",
                             fix=f"write it like `{key}: 3`")
    return float(v)


def parse_campaign(data, where: str = "campaign") -> CampaignSpec:
    """A `campaign:` mapping (or the flags gathered into one) -> CampaignSpec, every value
    checked: one clear message for the first thing wrong."""
    if not isinstance(data, dict):
        raise TrainplanError(f"{where}: campaign must be a mapping of settings, got {data!r}.",
                             fix="write it like `campaign: {runs: 100, per: year}`")
    kw: dict = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key not in KEYS:
            raise unknown("campaign setting", key, KEYS, n=1, allowed=", ".join(KEYS),
                          what=f"{where}: unknown campaign setting {k!r}.")
        if v is not None:
            kw[key] = v
    runs = kw.get("runs", 1)
    if not (isinstance(runs, int) and not isinstance(runs, bool) and runs >= 1):
        raise TrainplanError(f"{where}: campaign runs must be a whole number >= 1, got {runs!r}.",
                             fix="write it like `runs: 100`")
    kw["runs"] = runs
    if "per" in kw and (not isinstance(kw["per"], str) or kw["per"] not in PERIOD_S):
        raise unknown("period", str(kw["per"]), tuple(PERIOD_S), n=1,
                      what=f"{where}: campaign per {kw['per']!r} is not a period.",
                      allowed=", ".join(PERIOD_S))
    prices = ownership()["electricity_usd_per_kwh"]
    regions = tuple(r for r in prices if not r.startswith("_"))
    if "region" in kw and (not isinstance(kw["region"], str) or kw["region"] not in regions):
        raise unknown("region", str(kw["region"]), regions, n=1, allowed=", ".join(regions),
                      what=f"{where}: campaign region {kw['region']!r} has no electricity "
                           "price.", hint="give electricity_usd_per_kwh yourself instead")
    for key, positive in (("electricity_usd_per_kwh", False), ("hardware_usd", False),
                          ("lifetime_years", True)):
        if key in kw:
            kw[key] = _number(where, key, kw[key], positive)
    if "sweep" in kw:
        kw["sweep"] = _sweep(kw["sweep"], where)
    spec = CampaignSpec(**kw)
    if len(spec.variants()) > MAX_VARIANTS:
        raise TrainplanError(f"{where}: the sweep has {len(spec.variants())} planned variants "
                             f"(combinations of {', '.join(PLAN_KEYS)}); at most "
                             f"{MAX_VARIANTS} are planned in one campaign.",
                             fix="sweep fewer settings at once, or fewer values")
    return spec


def _sweep(data, where: str) -> tuple[tuple[str, tuple], ...]:
    if not isinstance(data, dict) or not data:
        raise TrainplanError(f"{where}: campaign sweep must map settings to lists of values.",
                             fix="write it like `sweep: {learning_rate: [1.0e-4, 3.0e-4]}`")
    out = []
    for k, values in data.items():
        key = str(k).replace("-", "_")
        if key not in PLAN_FREE + PLAN_KEYS:
            raise unknown("sweep key", key, PLAN_FREE + PLAN_KEYS, n=1,
                          what=f"{where}: campaign sweep key {k!r} is not one trainplan knows.",
                          allowed=", ".join(PLAN_FREE + PLAN_KEYS))
        if not isinstance(values, list) or not values or any(isinstance(v, (dict, list))
                                                              for v in values):
            raise TrainplanError(f"{where}: campaign sweep {k!r} must be a non-empty list of "
                                 f"values, got {values!r}.",
                                 fix=f"write it like `{key}: [1, 2, 3]`")
        if len(set(map(str, values))) != len(values):
            raise TrainplanError(f"{where}: campaign sweep {k!r} repeats a value: {values!r}.",
                                 fix="list each value once (use runs: N for repeats)")
        out.append((key, tuple(values)))
    return tuple(out)
