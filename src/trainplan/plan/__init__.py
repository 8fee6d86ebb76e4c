"""Plans over platforms: fit after fixes, micro-batch and accumulation, step time, sessions and
quota, checkpoints, dollars, a verdict and checklist per platform, and a ranking.

    make_plan(job, platforms, optimize, budget_usd, deadline_s) -> Plan     (build.py)
    select_platforms(ids, platforms_file)                       (..platforms, re-exported)

Modules, in data-flow order: interpolate.py (a trace at batch b from two others), traces.py
(traces shared across platforms), fixes.py (the fix ladder), sessions.py, storage.py, cost.py
(pure arithmetic), planner.py (one job on one platform), verdict.py, rank.py, result.py (the
typed result every report reads).
"""
from ..platforms import select_platforms
from .build import make_plan
from .planner import Planner
from .result import SCHEMA_VERSION, Plan, PlatformPlan

__all__ = ["SCHEMA_VERSION", "Plan", "PlatformPlan", "Planner", "make_plan", "select_platforms"]
