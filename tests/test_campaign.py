"""Campaigns (campaign.py, plan/campaign.py): hand-computed quota weeks, electricity,
amortization and crossovers; sweeps that trace once; the JSON and reports; bad input."""
import json
import math

import pytest

from trainplan.campaign import PERIOD_S, CampaignSpec, parse_campaign
from trainplan.errors import TrainplanError
from trainplan.plan import Planner, make_plan
from trainplan.plan.campaign import _totals, campaign_plan, crossover, variant_jobs
from trainplan.platforms import load_platforms

from conftest import tiny_job
from plan_examples import run_cli

H = 3600.0
WEEK = 7 * 24 * H
P = load_platforms()
LOCAL, KAGGLE = P["local-rtx-3050"], P["kaggle-t4x2"]
CLOUD, COLAB = P["lambda-gpu-1x-a100"], P["colab-pro-a100"]


def test_a_weekly_quota_binds_the_calendar():
    # 10 runs of 10 h on Kaggle's 30 h weekly quota: 100 h = 3 full weeks of quota + 10 h
    t = _totals(KAGGLE, 100 * H, CampaignSpec(runs=10))
    assert t["calendar_s"] == pytest.approx(3 * WEEK + 10 * H)
    assert t["total_usd"] == 0 and t["electricity_usd"] == 0 and t["hardware_usd"] == 0


def test_owned_hardware_electricity_and_amortization():
    # 100 runs of 2 h on an RTX 3050 (130 W board): 200 h x 130 W = 26 kWh; at $0.20/kWh $5.20.
    # The board's $249 over 3 years, for a year of work: $83.
    spec = CampaignSpec(runs=100, per="year", electricity_usd_per_kwh=0.20, lifetime_years=3)
    t = _totals(LOCAL, 200 * H, spec)
    assert t["energy_kwh"] == pytest.approx(26.0)
    assert t["electricity_usd"] == pytest.approx(5.20)
    assert t["hardware_usd"] == pytest.approx(249 / 3)
    assert t["total_usd"] == pytest.approx(249 / 3 + 5.20)
    # without a period the hardware is charged for the time the runs take: 200 h of 3 years
    t = _totals(LOCAL, 200 * H, CampaignSpec(electricity_usd_per_kwh=0.20, lifetime_years=3))
    assert t["hardware_usd"] == pytest.approx(249 * 200 * H / (3 * PERIOD_S["year"]))
    # the user's own machine price, and never more than the whole price
    t = _totals(LOCAL, 10 * PERIOD_S["year"], CampaignSpec(hardware_usd=700, lifetime_years=1))
    assert t["hardware_usd"] == pytest.approx(700)


def test_the_crossover_against_a_cloud_gpu_by_hand():
    # a year of runs: the 3050 costs 249/3 + 130 W x 5 h x $0.20 a run = 83 + 0.13 n;
    # the cloud A100 $1.29/h x 1 h a run = 1.29 n. 83 + 0.13 n <= 1.29 n from n = 71.6 -> 72
    spec = CampaignSpec(per="year", electricity_usd_per_kwh=0.20, lifetime_years=3)
    n = crossover((LOCAL, 5 * H), (CLOUD, 1 * H), spec)
    assert n == math.ceil((249 / 3) / (1.29 - 0.13))
    # a free tier is never beaten; a machine already cheaper on run 1 crosses at 1
    assert crossover((LOCAL, 5 * H), (KAGGLE, 1 * H), spec) is None
    assert crossover((LOCAL, 5 * H), (CLOUD, 1 * H), CampaignSpec(hardware_usd=0)) == 1


def _run_by_run(owned, other, spec) -> int | None:
    """The crossover as defined: each run count in turn up to LINEAR_RUNS, then bisection."""
    from trainplan.plan.campaign import LINEAR_RUNS, MAX_CROSSOVER_RUNS

    def cheaper(n):
        return _totals(owned[0], n * owned[1], spec)["total_usd"] <= \
            _totals(other[0], n * other[1], spec)["total_usd"] + 1e-9
    hit = next((n for n in range(1, LINEAR_RUNS + 1) if cheaper(n)), None)
    if hit is not None or not cheaper(MAX_CROSSOVER_RUNS):
        return hit
    lo, hi = LINEAR_RUNS, MAX_CROSSOVER_RUNS
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cheaper(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("spec", [
    CampaignSpec(per="year", electricity_usd_per_kwh=0.20, lifetime_years=3),
    CampaignSpec(electricity_usd_per_kwh=0.35, lifetime_years=1),
    CampaignSpec(per="month", hardware_usd=2500),
], ids=["year", "no-period", "month"])
def test_the_crossover_skips_only_runs_that_cannot_cross(spec):
    """crossover rules out stretches of runs where the owned machine's total at the first is
    already above the other's at the last: the same answer as trying each run count, against
    every kind of platform (hourly cloud, Colab's subscription with compute units, quotas)."""
    others = [p for p in P.values() if p.is_current and p.provider != "local"]
    hits = 0
    for per_run in (0.5 * H, 5 * H, 60 * H):
        for other in others:
            for ratio in (0.3, 1.0, 4.0):
                owned, rival = (LOCAL, per_run), (other, per_run * ratio)
                n = crossover(owned, rival, spec)
                assert n == _run_by_run(owned, rival, spec), (other.id, per_run, ratio)
                hits += n is not None
    assert hits > 10                  # crossings found, not only None


def test_bad_campaign_input_is_one_clear_error():
    with pytest.raises(TrainplanError, match="runs must be a whole number"):
        parse_campaign({"runs": 0})
    with pytest.raises(TrainplanError, match="electricity_usd_per_kwh must be a number >= 0"):
        parse_campaign({"runs": 2, "electricity_usd_per_kwh": -0.1})
    with pytest.raises(TrainplanError, match="Did you mean 'learning_rate'"):
        parse_campaign({"sweep": {"learning_rat": [1e-4]}})
    with pytest.raises(TrainplanError, match="is not a period"):
        parse_campaign({"per": "decade"})
    with pytest.raises(TrainplanError, match="non-empty list"):
        parse_campaign({"sweep": {"seq_len": []}})


@pytest.mark.parametrize("argv, words", [
    (["--runs", "0"], "runs must be a whole number"),
    (["--runs", "3", "--electricity-price", "-1"], "must be a number >= 0"),
    (["--runs", "3", "--region", "mars"], "has no electricity price"),
])
def test_bad_campaign_flags_exit_2(capsys, tmp_path, argv, words):
    job = tmp_path / "job.yaml"
    job.write_text("model: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128,"
                   " vocab_size: 256}\nseq_len: 32\nsteps: 10\n")
    code, out, err = run_cli(capsys, "plan", str(job), "--platforms", "kaggle-t4x2", *argv)
    assert code == 2 and words in err and "Traceback" not in err


def test_a_learning_rate_sweep_traces_once_and_lengths_once_each(monkeypatch):
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", "off")     # count traces, not stored ones
    job = tiny_job(steps=100)
    platforms = [KAGGLE, LOCAL]
    planner = Planner(job)
    base = make_plan(job, platforms, planner=planner)
    traced = planner.traces.traced
    spec = parse_campaign({"runs": 2, "sweep": {"learning_rate": [1e-4, 3e-4, 1e-3]}})
    variants = variant_jobs(job, spec)
    assert variants == [({}, job)] and spec.total_runs == 6
    plan = campaign_plan(base, [(s, base) for s, _ in variants], spec, platforms)
    assert planner.traces.traced == traced          # no new trace for the learning rates
    assert plan.platform("kaggle-t4x2").campaign.runs == 6
    lengths = parse_campaign({"sweep": {"seq_len": [16, 32, 64]}})
    plans = [(s, make_plan(jv, platforms, planner=planner)) for s, jv in
             variant_jobs(job, lengths)]
    new = planner.traces.traced - traced
    assert 0 < new <= 2 * traced                     # 16 and 64: no more than 32 cost each
    plan = campaign_plan(base, plans, lengths, platforms)
    c = plan.platform("local-rtx-3050").campaign
    accel = sum(v.platform("local-rtx-3050").sessions.accelerator_s for _, v in plans)
    assert c.accelerator_s == pytest.approx(accel) and c.runs == 3
    assert c.owned and c.crossovers[0].platform_id == "kaggle-t4x2"
    assert c.cost_by_runs[0][0] == 1 and c.cost_by_runs[-1] == (3, pytest.approx(c.total_usd))


def test_plan_json_and_reports_show_the_campaign(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128,"
                   " vocab_size: 256}\nseq_len: 32\nsteps: 1000\n"
                   "campaign: {runs: 50, per: year, region: eu}\n")
    code, out, err = run_cli(capsys, "plan", str(job), "--platforms",
                             "kaggle-t4x2,local-rtx-3050,colab-pro-a100", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["campaign"]["runs"] == 50 and doc["campaign"]["per"] == "year"
    local = next(p for p in doc["platforms"] if p["platform_id"] == "local-rtx-3050")
    c = local["campaign"]
    assert c["owned"] and c["hardware_usd"] == pytest.approx(249 / 3)
    assert c["total_usd"] == pytest.approx(c["hardware_usd"] + c["electricity_usd"])
    colab = next(p for p in doc["platforms"] if p["platform_id"] == "colab-pro-a100")
    assert colab["campaign"]["subscription_usd"] == pytest.approx(12 * 9.99)
    code, out, err = run_cli(capsys, "plan", str(job), "--platforms",
                             "kaggle-t4x2,local-rtx-3050,colab-pro-a100", "--format", "md")
    assert "## Campaign" in out
    assert "local-rtx-3050: never cheaper than kaggle-t4x2; cheaper than colab-pro-a100 from run 1" \
        in out
    code, out, err = run_cli(capsys, "plan", str(job), "--platforms",
                             "kaggle-t4x2,local-rtx-3050", "--format", "html")
    assert 'id="campaign-cost"' in out or "Cumulative cost of the campaign" in out
