"""Rank planned platforms under an objective, a budget and a deadline; one reason per platform.

Platforms fall in tiers, best first: (0) fits, within budget and deadline; (1) fits but over
budget or past the deadline, or only after a fix that changes what is trained (LoRA, shorter
sequences), or fits only tightly (OOM-prone); (2) won't fit; (3) retired. Within a tier:

    time      shortest time to finish (sessions and quota waits included), then cheapest
    cost      cheapest, then shortest
    balanced  dollars + time to finish x VALUE_OF_TIME_USD_PER_H, then shortest

VALUE_OF_TIME_USD_PER_H is the seeds' own assumption ("Assuming $10/hour opportunity cost",
seed 000's time-cost table): the price of waiting, so a free platform that takes a week does not
beat a $2 hour. Ties break on the platform id, so the order is stable.
"""
from __future__ import annotations

from dataclasses import replace

from ..units import fmt_seconds, fmt_usd
from .result import READY, READY_WITH_CHANGES, RETIRED, TIGHT, PlatformPlan

VALUE_OF_TIME_USD_PER_H = 10.0


def tier(p: PlatformPlan) -> int:
    if p.verdict == RETIRED:
        return 3
    if p.verdict not in (READY, READY_WITH_CHANGES, TIGHT):
        return 2
    if (p.within_budget is False or p.meets_deadline is False or _training_changes(p)
            or p.verdict == TIGHT):
        return 1
    return 0


def _training_changes(p: PlatformPlan) -> list[str]:
    return [f.title for f in p.fixes if f.changes_training and not f.note]


def _finish(p: PlatformPlan) -> float:
    return p.sessions.finish_s if p.sessions else float("inf")


def _usd(p: PlatformPlan) -> float:
    return p.cost.total_usd if p.cost else float("inf")


def score(p: PlatformPlan, optimize: str) -> tuple:
    """Sort key within a tier (lower is better)."""
    if p.sessions is None or p.cost is None:   # not fitting: closest to fitting first
        used = p.device_used_bytes or 0
        return (used / p.capacity_bytes if p.capacity_bytes else float("inf"), p.platform_id)
    if optimize == "time":
        return (_finish(p), _usd(p), p.platform_id)
    if optimize == "cost":
        return (round(_usd(p), 2), _finish(p), p.platform_id)
    return (_usd(p) + _finish(p) / 3600 * VALUE_OF_TIME_USD_PER_H, _finish(p), p.platform_id)


def _why_not(p: PlatformPlan, budget_usd, deadline_s) -> str:
    why = []
    changed = _training_changes(p)
    if changed:
        why.append("fits only by changing what is trained: " + ", ".join(changed))
    if p.verdict == TIGHT:
        band = p.fit_band or {}
        why.append(f"fits tightly ({max(0.0, p.fit_margin or 0.0):.0%} of the device free, "
                   f"under its {band.get('p95', 0.0):.1%} error band): prone to out-of-memory "
                   "errors")
    if p.within_budget is False:
        why.append(f"over budget: {fmt_usd(_usd(p))} > {fmt_usd(budget_usd)}")
    if p.meets_deadline is False:
        why.append(f"misses the deadline: {fmt_seconds(_finish(p))} > {fmt_seconds(deadline_s)}")
    return "; ".join(why)


def _versus(p: PlatformPlan, w: PlatformPlan, optimize: str) -> str:
    """Why `p` lost to the winner `w`: slower and/or dearer, with the numbers."""
    tf, wf, tu, wu = _finish(p), _finish(w), _usd(p), _usd(w)
    slower = (f"{tf / wf:.1f}x slower than {w.platform_id} ({fmt_seconds(tf)} vs {fmt_seconds(wf)})"
              if wf > 0 and tf > wf * 1.005 else "")
    dearer = f"costs {fmt_usd(tu - wu)} more ({fmt_usd(tu)} vs {fmt_usd(wu)})" if tu > wu + 0.005 else ""
    first, second = (dearer, slower) if optimize == "cost" else (slower, dearer)
    parts = [x for x in (first, second) if x]
    if not parts:
        return f"ties with {w.platform_id}"
    if optimize == "balanced" and slower and tu < wu - 0.005:
        parts.append(f"saves {fmt_usd(wu - tu)}, not worth the wait at "
                     f"${VALUE_OF_TIME_USD_PER_H:.0f}/h")
    if optimize == "balanced" and dearer and tf < wf * 0.995:
        parts.append(f"faster by {fmt_seconds(wf - tf)}, not worth {fmt_usd(tu - wu)}")
    return "; ".join(parts)


def rank(plans: list[PlatformPlan], optimize: str, budget_usd: float | None = None,
         deadline_s: float | None = None) -> list[PlatformPlan]:
    """The plans in rank order, each with `rank` (1 = recommended) and a one-line `reason`."""
    ordered = sorted(plans, key=lambda p: (tier(p), score(p, optimize)))
    eligible = [p for p in ordered if tier(p) == 0]
    winner = eligible[0] if eligible else None
    out = []
    for i, p in enumerate(ordered, start=1):
        t = tier(p)
        if p is winner:
            what = {"time": "fastest to finish", "cost": "cheapest",
                    "balanced": "best balance of time and cost"}[optimize]
            reason = (f"{what}: {fmt_seconds(_finish(p))}, {fmt_usd(_usd(p))}"
                      f" ({len(eligible)} of {len(plans)} platforms qualify)")
        elif t == 0:
            reason = _versus(p, winner, optimize)
        elif t == 1:
            reason = _why_not(p, budget_usd, deadline_s)
        elif t == 2:
            reason = f"won't fit: {p.reason or 'see checklist'}"
        else:
            reason = f"{p.status} since {p.retired_on or 'the catalog date'}; not offered any more"
        out.append(replace(p, rank=i, reason=reason))
    return out
