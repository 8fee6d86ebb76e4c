"""Dollars for a run on a platform, from the catalog's prices (`data/platforms.csv`).

    accelerator hours  h = A / 3600          A: accelerator seconds incl. session overheads
    compute            $ = h x usd_per_hour  (cloud on-demand; Colab: CU/h x $/CU)
    subscription       m = ceil(F / month) months of `usd_per_month` when the tier has a fee
                       (F: time to finish); a Colab subscription includes
                       usd_per_month / usd_per_compute_unit compute units a month (Pro: $9.99 ->
                       100 CU, Pro+: $49.99 -> 500 CU, S26), so only CUs beyond those are bought
    total              m x fee + max(0, CU - m x included CU) x $/CU     (compute-unit tiers)
                       m x fee + compute $                              (otherwise)

Free tiers and owned hardware cost 0 (electricity is not counted). The subscription is counted in
full: a plan is for someone who does not pay for it yet.
"""
from __future__ import annotations

import math

from ..campaign import PERIOD_S
from ..platforms import Platform
from .result import Cost

MONTH_S = PERIOD_S["month"]


def run_cost(platform: Platform, accel_s: float, finish_s: float) -> Cost:
    """Cost of `accel_s` accelerator seconds finishing after `finish_s` on `platform`."""
    hours = accel_s / 3600.0
    compute_usd = hours * platform.usd_per_hour
    fee = platform.usd_per_month or 0.0
    months = max(1, math.ceil(finish_s / MONTH_S - 1e-9)) if fee > 0 else 0
    cu = None
    if platform.compute_units_per_hour is not None and platform.usd_per_compute_unit:
        cu = hours * platform.compute_units_per_hour
        included = fee / platform.usd_per_compute_unit * months
        total = months * fee + max(0.0, cu - included) * platform.usd_per_compute_unit
    else:
        total = months * fee + compute_usd
    return Cost(usd_per_hour=platform.usd_per_hour, accelerator_hours=hours,
                compute_usd=compute_usd, subscription_usd=months * fee, total_usd=total,
                compute_units=cu, months=months)
