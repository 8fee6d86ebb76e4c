"""`trainplan plan` and `trainplan estimate` agree: for each bundled example and each platform it
is planned on, `estimate` of the job as planned there (the platform's accelerator and count, the
plan's strategy, precision, micro-batch and accumulation, after any fix) gives the plan's memory,
step time and largest micro-batch (plan/build.py: "the same search, the same answer `trainplan
estimate` gives for that job there").

Each example is planned once (module scope). Each `estimate` runs on a fresh trace cache, as the
command does; real traces are deterministic, so `trace_step` is memoised for the module and the
estimates re-use the plan's real traces instead of tracing them again (which batches each cache
holds, and so what it interpolates, is unchanged). Platforms: those each example lists.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from plan_examples import planning

import trainplan.trace.derive.cache as cache_mod
import trainplan.trace.derive.schedule as schedule_mod
from trainplan.estimate import estimate
from trainplan.platforms import host_cpu
from trainplan.plan import Planner, make_plan, select_platforms
from trainplan.plan.planner import platform_job
from trainplan.spec import validate
from trainplan.jobfile import load_job
from trainplan.trace.parallel import Forward
from trainplan.trace.facts import Trace

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-9

# example -> the platforms it lists (`platforms:`), named here so that each is a test case
PLATFORMS = {
    "graphmer-se": ("kaggle-t4x2", "colab-pro-tpu-v5e-1", "local-rtx-3050"),
    "glf-cr-2xt4": ("kaggle-t4x2",),
    "chart-rvr-grpo": ("kaggle-t4x2", "colab-pro-a100"),
}
CASES = [(ex, pid) for ex, pids in PLATFORMS.items() for pid in pids]


@pytest.fixture(scope="module", autouse=True)
def real_traces():
    """Memoise the real traces the trace cache (trace/derive/) takes, one at a time (`trace_step`) or on all
    cores (`trace_all`, the planner's prefetch): every real trace is taken once per module."""
    one, many = cache_mod.trace_one, schedule_mod.trace_all
    memo: dict[tuple, Trace] = {}

    def key(job, sem, batch, depth=None):
        return repr(job), sem.key(), batch or job.batch_size, depth

    def trace_one(request):
        k = key(*request)
        if k not in memo:
            memo[k] = one(request)
        return memo[k]

    def traced(requests, finish=None, forwards=()):
        """The steps `requests`, each traced once per module, and the generation `forwards`
        beside them on all cores (as the planner's rounds make them): (steps, forwards)."""
        todo = list({key(*r): r for r in requests if key(*r) not in memo}.values())
        made = many(todo + list(forwards), finish=finish) if todo or forwards else []
        failed = {}
        for r, tr in zip(todo, made):
            if isinstance(tr, Trace):
                memo[key(*r)] = tr
            else:
                failed[key(*r)] = tr
        return [memo.get(key(*r)) or failed[key(*r)] for r in requests], made[len(todo):]

    def trace_all(requests, followups=None, policy=None, started=None, finish=None):
        """trace_all's contract: each follow-up made once its request is in, unless skipped;
        generation forwards (`Forward`, kept by trace/derive/inference.py's own memo) as they come."""
        followups = followups or [None] * len(requests)
        steps = [i for i, r in enumerate(requests) if not isinstance(r, Forward)]
        forwards = [i for i, r in enumerate(requests) if isinstance(r, Forward)]
        results, more = [None] * len(requests), [None] * len(requests)
        made, fwd = traced([requests[i] for i in steps], finish, [requests[i] for i in forwards])
        for i, tr in zip(steps + forwards, made + fwd):
            results[i] = tr
        wanted = [i for i, f in enumerate(followups)
                  if f is not None and (policy(i, True, results[i]) if policy else "run") != "skip"]
        for i, tr in zip(wanted, traced([followups[i] for i in wanted], finish)[0]):
            more[i] = tr
        return (results, more) if any(f is not None for f in followups) else results

    mp = pytest.MonkeyPatch()
    mp.setattr(cache_mod, "trace_one", trace_one)
    mp.setattr(schedule_mod, "trace_all", trace_all)
    yield memo
    mp.undo()


class Planned:
    """One example planned on its platforms, with the planner that planned it."""

    def __init__(self, example: str):
        self.job = validate(load_job(str(ROOT / "examples" / f"{example}.yaml")))
        assert set(PLATFORMS[example]) == {p.lower() for p in self.job.platforms}
        self.platforms = {p.id: p for p in select_platforms(list(PLATFORMS[example]))}
        self.planner = Planner(self.job)
        with planning(example):      # one pytest-xdist worker traces it, the others read it
            self.plan = make_plan(self.job, list(self.platforms.values()), planner=self.planner)

    def config(self, platform_id: str):
        """The configuration the plan chose on the platform, as plan/build.py `plan_platform`
        reaches it: the job adapted to the platform, its micro-batch and accumulation, and the
        fix ladder when the device does not hold it (the examples set no deadline)."""
        platform = self.platforms[platform_id]
        jp, _changes = platform_job(self.job, platform)
        cfg = self.planner.configure(jp, platform)
        if not cfg.device_fits:
            _jv, cfg, _fixes, _skipped = self.planner.ladder(jp, platform, cfg,
                                                             need=lambda c: c.device_fits)
        return cfg


@pytest.fixture(scope="module")
def planned():
    cache: dict[str, Planned] = {}

    def get(example: str) -> Planned:
        if example not in cache:
            cache[example] = Planned(example)
        return cache[example]
    return get


def _ids(case) -> str:
    return "-".join(case)


@pytest.fixture(scope="module")
def agreement(planned):
    """(example, platform) -> (the plan's row, the config it rests on, the estimate of its job);
    skips a platform the plan does not fit on (the examples fit on all of theirs)."""
    cache = {}

    def get(example: str, platform_id: str):
        if (example, platform_id) not in cache:
            pl = planned(example)
            row = pl.plan.platform(platform_id)
            cfg = pl.config(platform_id)
            est = estimate(cfg.job, pl.platforms[platform_id].accelerator,     # on its host CPU
                           host_speed=host_cpu(platform_id).speed) if row.fits else None
            cache[example, platform_id] = row, cfg, est
        row, cfg, est = cache[example, platform_id]
        if est is None:
            pytest.skip(f"{platform_id}: the plan does not fit ({row.verdict})")
        return row, cfg, est
    return get


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_estimate_fits_where_the_plan_does(case, agreement):
    row, _cfg, est = agreement(*case)
    assert row.device_used_bytes <= row.capacity_bytes
    assert est.fits and not est.blocked
    assert not any(f.severity == "error" for f in est.findings)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_the_rebuilt_job_is_the_planned_one(case, agreement):
    row, cfg, est = agreement(*case)
    job = est.job
    assert job is cfg.job
    assert (job.batch_size, job.grad_accum) == (row.micro_batch_size, row.grad_accum)
    assert (job.strategy.name, job.precision.name) == (row.strategy, row.precision)
    assert (job.gpu, job.gpus) == (row.accelerator_id, row.accelerator_count)
    assert est.accel.id == row.accelerator_id and est.devices == row.devices
    # and the plan's figures are this configuration's
    assert (cfg.memory.device_used_bytes, cfg.memory.required_bytes) == (
        row.device_used_bytes, row.required_bytes)
    assert cfg.time.step_time_s == row.step_time_s


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_estimate_memory_equals_the_plan(case, agreement):
    row, _cfg, est = agreement(*case)
    assert est.memory.device_used_bytes == pytest.approx(row.device_used_bytes, rel=REL)
    assert est.memory.required_bytes == pytest.approx(row.required_bytes, rel=REL)
    assert est.memory.capacity_bytes == row.capacity_bytes
    assert est.memory.peak_phase == row.peak_phase
    assert est.memory.breakdown_bytes == row.memory_breakdown_bytes
    assert est.memory.host_ram_bytes == row.host_ram_bytes


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_estimate_step_time_equals_the_plan(case, agreement):
    row, _cfg, est = agreement(*case)
    assert est.time.step_time_s == pytest.approx(row.step_time_s, rel=REL)
    assert est.time.samples_per_s == pytest.approx(row.samples_per_s, rel=REL)
    assert est.time.mfu == pytest.approx(row.mfu, rel=REL)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_estimate_largest_micro_batch_equals_the_plan(case, agreement):
    row, _cfg, est = agreement(*case)
    assert row.max_micro_batch_size is not None
    assert est.max_batch_size == row.max_micro_batch_size
    assert row.micro_batch_size <= row.max_micro_batch_size


def test_every_listed_platform_was_planned_and_fits(planned):
    # the examples plan as their comments say: every platform runs the job (so no case skips)
    for example, pids in PLATFORMS.items():
        plan = planned(example).plan
        assert {p.platform_id for p in plan.platforms} == set(pids)
        assert all(p.fits for p in plan.platforms), example
