"""Session, checkpoint-cadence and quota arithmetic (plan/sessions.py), on hand-computed cases."""
import math

import pytest

from trainplan.plan import sessions as s

H = 3600.0
WEEK = 7 * 24 * H


def test_30h_job_on_12h_sessions_and_30h_week():
    # 30 h of work, 12 h sessions, 10 min start-up, 30 h/week (the example):
    # u = 11 h 50 min; n = ceil(30 / 11.8333) = 3; A = 30 h + 3 x 10 min = 30.5 h;
    # q = 30.5 / 30 = 1.0167 weeks -> spans 2 weekly quotas; F = 1 week + 0.5 h.
    work, session, o, quota = 30 * H, 12 * H, 600.0, 30 * H
    assert s.usable_session_s(session, o) == 11 * H + 50 * 60
    n = s.sessions_needed(work, session, o)
    assert n == 3
    a = s.accelerator_s(work, n, o)
    assert a == 30.5 * H
    assert s.quota_weeks(a, quota) == pytest.approx(30.5 / 30)
    assert s.calendar_weeks(a, quota) == 2
    assert s.finish_s(a, quota) == WEEK + 0.5 * H


def test_no_session_limit_is_one_session():
    assert s.sessions_needed(100 * H, None, 600) == 1
    assert s.usable_session_s(None, 600) is None
    assert s.accelerator_s(100 * H, 1, 600) == 100 * H + 600


def test_a_session_that_is_all_overhead_cannot_run():
    assert s.sessions_needed(H, 600, 600) is None
    assert s.sessions_needed(H, 600, 900) is None


def test_work_filling_whole_sessions_exactly_needs_no_extra_session():
    # u = 12 h - 1 h = 11 h; 33 h of work is exactly 3 sessions (float noise must not make it 4)
    assert s.sessions_needed(33 * H, 12 * H, H) == 3
    assert s.sessions_needed(33 * H + 1, 12 * H, H) == 4
    assert s.sessions_needed(1.0, 12 * H, H) == 1


def test_finish_without_quota_or_within_one_week_is_the_accelerator_time():
    assert s.finish_s(50 * H, None) == 50 * H
    assert s.finish_s(20 * H, 30 * H) == 20 * H
    assert s.quota_weeks(20 * H, None) is None and s.calendar_weeks(20 * H, None) is None


def test_quota_of_exactly_two_weeks():
    # 60 h on 30 h/week: week 1 uses 30 h, wait for the reset, week 2 uses 30 h
    assert s.calendar_weeks(60 * H, 30 * H) == 2
    assert s.finish_s(60 * H, 30 * H) == WEEK + 30 * H
    # 61 h: a third week for the last hour
    assert s.calendar_weeks(61 * H, 30 * H) == 3
    assert s.finish_s(61 * H, 30 * H) == 2 * WEEK + H


def test_checkpoint_interval_divides_the_usable_session():
    # u = 42600 s; at most 1800 s -> ceil(42600 / 1800) = 24 intervals of 1775 s
    k = s.checkpoint_every_s(42600.0)
    assert k == pytest.approx(1775.0)
    assert math.isclose(42600.0 / k, round(42600.0 / k))
    # no background execution and a 20 min idle timeout: intervals <= 1200 s -> 36 of 1183.3 s
    assert s.checkpoint_every_s(42600.0, idle_timeout_s=1200, background=False) == pytest.approx(42600 / 36)
    # background execution: the idle timeout does not cut a running job
    assert s.checkpoint_every_s(42600.0, idle_timeout_s=1200, background=True) == pytest.approx(1775.0)
    # unlimited sessions: the cap itself
    assert s.checkpoint_every_s(None) == s.CHECKPOINT_EVERY_S


def test_checkpoint_every_steps():
    assert s.checkpoint_every_steps(1775.0, 0.8625) == 2057      # floor(2057.97)
    assert s.checkpoint_every_steps(10.0, 60.0) == 1             # at least every step
