"""Sessions, checkpoint cadence and weekly quota: pure arithmetic on seconds.

A notebook platform runs a job in sessions of at most `session_max_s` (Kaggle GPU 12 h, TPU 9 h;
Colab free 12 h). Every session pays an overhead `o` before the first useful step: start-up
(environment, installs, data), loading the last checkpoint, and on a TPU compiling the step graph
again (XLA caches per process). With `W` seconds of training work:

    usable per session   u = session_max - o                      (must be > 0)
    sessions             n = ceil(W / u)                          (1 without a session limit)
    accelerator time     A = W + n * o                            (what a quota is charged)
    quota weeks          q = A / weekly_quota
    calendar weeks       c = ceil(q)
    time to finish       F = A                                    if no quota or A <= quota
                         F = (c - 1) * 1 week + (A - (c - 1) * quota)   otherwise

F assumes the run starts right after a quota reset and sessions follow each other at once.
Checkpoints are saved every `k` <= CHECKPOINT_EVERY_S seconds, with `k` chosen to divide `u` into
whole intervals, so a session that hits its limit loses nothing and an unexpected disconnect loses
at most `k`. Example (tests/test_sessions.py): 30 h of work, 12 h sessions, 10 min overhead,
30 h/week: u = 11 h 50 min, n = 3, A = 30.5 h, q = 1.017, c = 2, F = 1 week + 30 min.
Not modelled: steps are not split at session boundaries (a step is short against an hour), time
spent queueing for a free accelerator, and sessions capped by the quota left in a week.
"""
from __future__ import annotations

import math

HOUR_S = 3600.0
WEEK_S = 7 * 24 * HOUR_S
# A choice, not a measurement: the most work a disconnect may lose. Seeds 001 and 004 save every
# 500-1000 steps; at their step times that is minutes to an hour.
CHECKPOINT_EVERY_S = 1800.0
# Per-session start-up when the job does not say (`session_overhead_s`): the seeds' own estimate
# of notebook setup (seed 000: "Setup Time 10 min" on Kaggle, 15 min Colab, 5 min local).
DEFAULT_SESSION_OVERHEAD_S = 600.0


def usable_session_s(session_max_s: float | None, overhead_s: float) -> float | None:
    """u = session_max - overhead; None when sessions are unlimited."""
    if session_max_s is None:
        return None
    return session_max_s - overhead_s


def sessions_needed(work_s: float, session_max_s: float | None, overhead_s: float) -> int | None:
    """n = ceil(W / u); 1 without a limit; None when a session is all overhead (u <= 0)."""
    u = usable_session_s(session_max_s, overhead_s)
    if u is None:
        return 1
    if u <= 0:
        return None
    return max(1, math.ceil(work_s / u - 1e-9))


def accelerator_s(work_s: float, sessions: int, overhead_s: float) -> float:
    """A = W + n * o: every session pays its overhead on the accelerator."""
    return work_s + sessions * overhead_s


def quota_weeks(accel_s: float, weekly_quota_s: float | None) -> float | None:
    """q = A / weekly quota; None when there is no quota."""
    if not weekly_quota_s:
        return None
    return accel_s / weekly_quota_s


def calendar_weeks(accel_s: float, weekly_quota_s: float | None) -> int | None:
    """c = ceil(q): the number of weekly quotas the run draws on."""
    q = quota_weeks(accel_s, weekly_quota_s)
    return None if q is None else max(1, math.ceil(q - 1e-9))


def finish_s(accel_s: float, weekly_quota_s: float | None) -> float:
    """F: wall clock to the last step, waiting for quota resets (see module docstring)."""
    c = calendar_weeks(accel_s, weekly_quota_s)
    if c is None or c <= 1:
        return accel_s
    return (c - 1) * WEEK_S + (accel_s - (c - 1) * weekly_quota_s)


def checkpoint_every_s(usable_s: float | None, idle_timeout_s: float | None = None,
                       background: bool = True, limit_s: float = CHECKPOINT_EVERY_S) -> float:
    """k: the largest interval <= limit that divides the usable session into whole intervals.

    Without background execution an idle disconnect can end the session any time after
    `idle_timeout_s`, so the interval is also kept <= the idle timeout.
    """
    cap = limit_s
    if not background and idle_timeout_s:
        cap = min(cap, idle_timeout_s)
    if usable_s is None or usable_s <= 0:
        return cap
    return usable_s / math.ceil(usable_s / cap - 1e-9)


def checkpoint_every_steps(interval_s: float, step_time_s: float) -> int:
    """Steps between checkpoints: floor(k / step time), at least 1."""
    if step_time_s <= 0:
        return 1
    return max(1, math.floor(interval_s / step_time_s))
