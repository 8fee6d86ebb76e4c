"""A campaign on each platform: N runs of the job (campaign.py), with quota, subscription, owned
hardware and electricity counted.

Per platform, from each planned variant i (its per-run accelerator time a_i, sessions n_i, as
plan/sessions.py computes them) run r_i times:

    accelerator time   A = sum r_i a_i                (every run pays its sessions' overheads)
    calendar           F = sessions.finish_s(A, weekly quota)   runs follow each other, one
                       session at a time (the catalog states no concurrent sessions), waiting
                       for quota resets when A exceeds a week's quota
    span               S = max(F, period)         a "per year" campaign pays a year of
                                                  subscription whatever its runs take
    cloud, notebooks   cost.run_cost(platform, A, S): hours x price, or compute units beyond
                       the subscription's months of S
    owned hardware     H = price x min(1, S / lifetime)   (data/ownership.json: the board's
                       launch price x count, or the user's `hardware_usd`; lifetime 3 years
                       unless given)
                       E = board power (tdp_watts x count) x A / 3600 / 1000 kWh x $/kWh
                       (the region's household price, or the user's): the rest of the PC is not
                       counted, nor is idle time between runs
    total              compute + subscription + H + E;  waiting = F / 3600 x $10/h (rank.py)

Crossover: for an owned platform against each other one, the smallest run count N (the
campaign's runs scaled, same mix of variants) from which the owned machine's total is no more
than the other's, searched run by run up to LINEAR_RUNS, then by bisection up to MAX_CROSSOVER_RUNS. A free tier is never crossed ($0); with a
period, the subscription and the hardware share are fixed costs and the crossover is where the
other platform's per-run dollars have paid for them.
"""
from __future__ import annotations

from dataclasses import replace

from ..campaign import PERIOD_S, CampaignSpec, ownership
from ..platforms import Platform
from .cost import run_cost
from .rank import VALUE_OF_TIME_USD_PER_H
from .result import Campaign, Crossover, Plan, PlatformPlan
from .sessions import WEEK_S, finish_s

MAX_CROSSOVER_RUNS = 100_000
LINEAR_RUNS = 2_000         # run by run up to here, then bisection (monotone by then)
_STRETCH = 50               # runs ruled out at once where the totals allow (crossover)


def is_owned(platform: Platform) -> bool:
    return platform.provider == "local"


def electricity_price(spec: CampaignSpec) -> tuple[float, str]:
    """($/kWh, where it comes from)."""
    if spec.electricity_usd_per_kwh is not None:
        return spec.electricity_usd_per_kwh, "given"
    data = ownership()
    region = spec.region or data["default_region"]
    row = data["electricity_usd_per_kwh"][region]
    return row["usd"], row["label"]


def lifetime_s(spec: CampaignSpec) -> float:
    years = spec.lifetime_years or ownership()["lifetime_years"]["value"]
    return years * PERIOD_S["year"]


def hardware_price(platform: Platform, spec: CampaignSpec) -> float | None:
    """The owned machine's price: the user's, else the board's launch price x count."""
    if spec.hardware_usd is not None:
        return spec.hardware_usd
    row = ownership()["purchase_usd"].get(platform.accelerator_id)
    return None if row is None else row["usd"] * platform.accelerator_count


def _totals(platform: Platform, accel_s: float, spec: CampaignSpec) -> dict:
    """Every dollar figure of A accelerator seconds on `platform` (module docstring)."""
    calendar = finish_s(accel_s, platform.weekly_quota_s)
    span = max(calendar, spec.period_s or 0.0)
    cost = run_cost(platform, accel_s, span)
    hardware = electricity = kwh = 0.0
    if is_owned(platform):
        price = hardware_price(platform, spec) or 0.0
        hardware = price * min(1.0, span / lifetime_s(spec))
        watts = (platform.accelerator.tdp_watts or 0) * platform.accelerator_count
        kwh = watts * accel_s / 3600 / 1000
        electricity = kwh * electricity_price(spec)[0]
    total = cost.total_usd + hardware + electricity
    return dict(calendar_s=calendar, compute_usd=cost.total_usd - cost.subscription_usd,
                subscription_usd=cost.subscription_usd, hardware_usd=hardware,
                electricity_usd=electricity, energy_kwh=kwh, total_usd=total,
                waiting_usd=calendar / 3600 * VALUE_OF_TIME_USD_PER_H)


def crossover(owned: tuple[Platform, float], other: tuple[Platform, float],
              spec: CampaignSpec) -> int | None:
    """The smallest run count from which the owned platform costs no more than the other;
    each given as (platform, accelerator seconds per run)."""
    def usd(side: tuple[Platform, float], n: int) -> float:
        return _totals(side[0], n * side[1], spec)["total_usd"]

    def cheaper(n: int) -> bool:
        return usd(owned, n) <= usd(other, n) + 1e-9

    # Both totals are non-decreasing in the runs (each of their terms is: hours, months of
    # subscription net of the compute units they include, the hardware's share of its lifetime,
    # kWh), so no n in [a, b] is cheaper where owned(a) > other(b): such stretches are skipped
    # whole, with the same answer as trying each n (tests/test_campaign.py).
    if usd(owned, 1) > usd(other, MAX_CROSSOVER_RUNS) + 1e-9:
        return None
    for start in range(1, LINEAR_RUNS + 1, _STRETCH):
        end = min(start + _STRETCH - 1, LINEAR_RUNS)
        if usd(owned, start) > usd(other, end) + 1e-9:
            continue
        for n in range(start, end + 1):
            if cheaper(n):
                return n
    if not cheaper(MAX_CROSSOVER_RUNS):
        return None
    lo, hi = LINEAR_RUNS, MAX_CROSSOVER_RUNS     # past the subscription's steps: one crossing
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cheaper(mid) else (mid, hi)
    return hi


def variant_jobs(job, spec: CampaignSpec) -> list[tuple[dict, object]]:
    """(settings, job) for each planned variant of the sweep: the job with PLAN_KEYS values set
    (lora_rank: the job's adapters at that rank, or rank-r adapters on all linear layers)."""
    from ..spec import Lora, validate
    out = []
    for settings in spec.variants():
        kw = dict(settings)
        if "lora_rank" in kw:
            rank = kw.pop("lora_rank")
            kw["lora"] = (replace(job.lora, rank=rank) if job.lora is not None
                          else Lora(rank=rank, alpha=2.0 * rank, targets="all-linear"))
        out.append((settings, validate(job.with_(**kw)) if kw else job))
    return out


def curve_runs(total: int, points: int = 10) -> list[int]:
    """Run counts the cumulative-cost curve is drawn at: 1, then `points` steps up to total."""
    return sorted({1, total, *(max(1, round(total * k / points)) for k in range(1, points))})


def _runs(pp: PlatformPlan) -> bool:
    return pp.sessions is not None and pp.verdict not in ("WON'T FIT", "RETIRED")


def campaign_plan(plan: Plan, variants: list[tuple[dict, Plan]], spec: CampaignSpec,
                  platforms: list[Platform]) -> Plan:
    """`plan` with a Campaign on every platform that runs every variant. `variants`: (the
    sweep's planned settings, that variant's plan), each run spec.repeats times."""
    by_id = {p.id: p for p in platforms}
    r = spec.repeats
    total_runs = r * len(variants)
    per_platform: dict[str, tuple[float, int]] = {}
    for pid in (p.platform_id for p in plan.platforms):
        rows = [v.platform(pid) for _, v in variants]
        if all(_runs(x) for x in rows):
            per_platform[pid] = (sum(r * x.sessions.accelerator_s for x in rows),
                                 sum(r * x.sessions.sessions for x in rows))
    out = []
    for pp in plan.platforms:
        if pp.platform_id not in per_platform:
            out.append(pp)
            continue
        platform = by_id[pp.platform_id]
        accel, sessions = per_platform[pp.platform_id]
        t = _totals(platform, accel, spec)
        quota = platform.weekly_quota_s
        crossings = ()
        if is_owned(platform):
            crossings = tuple(
                Crossover(o, crossover((platform, accel / total_runs),
                                       (by_id[o], a / total_runs), spec))
                for o, (a, _) in per_platform.items() if not is_owned(by_id[o]))
        out.append(replace(pp, campaign=Campaign(
            runs=total_runs, accelerator_s=accel, sessions=sessions, calendar_s=t["calendar_s"],
            runs_per_week=quota / (accel / total_runs) if quota else None,
            quota_binds=bool(quota) and accel > quota,
            within_period=t["calendar_s"] <= spec.period_s if spec.period_s else None,
            compute_usd=t["compute_usd"], subscription_usd=t["subscription_usd"],
            hardware_usd=t["hardware_usd"], electricity_usd=t["electricity_usd"],
            energy_kwh=t["energy_kwh"], total_usd=t["total_usd"], waiting_usd=t["waiting_usd"],
            owned=is_owned(platform), crossovers=crossings,
            cost_by_runs=tuple((n, _totals(platform, n * accel / total_runs, spec)["total_usd"])
                               for n in curve_runs(total_runs)))))
    price, price_src = electricity_price(spec)
    owned_prices = {p.id: hardware_price(p, spec) for p in platforms if is_owned(p)}
    summary = {
        "runs": total_runs, "runs_per_variant": r, "per": spec.per,
        "sweep": {k: list(v) for k, v in spec.sweep},
        "variants": [dict(v) for v, _ in variants],
        "electricity_usd_per_kwh": price, "electricity_source": price_src,
        "lifetime_s": lifetime_s(spec),
        "lifetime_years": lifetime_s(spec) / PERIOD_S["year"],
        "hardware_usd": owned_prices,
        "value_of_time_usd_per_h": VALUE_OF_TIME_USD_PER_H,
        "week_s": WEEK_S,
    }
    return replace(plan, platforms=tuple(out), campaign=summary)
