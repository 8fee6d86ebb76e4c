"""Golden reports of the three example jobs (Markdown and JSON), so that any change to a number
shows up in review as a diff of tests/golden/.

Refresh them on purpose only:  python -m pytest tests/test_golden.py --update-golden
(or TRAINPLAN_UPDATE_GOLDEN=1), then read the diff before committing it.

The JSON golden rounds floats to 10 significant digits: what the plan computes, without the last
bits of floating-point noise a different CPU or BLAS could change. Neither file holds a
timestamp or a trace wall time (checked below), so they are the same on every run.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest
from plan_examples import BENCH, EXAMPLES, SLOW_BENCH, example_doc

from trainplan.report.plan_markdown import plan_markdown

GOLDEN = Path(__file__).parent / "golden"
SIGNIFICANT = 10


@pytest.fixture
def update(request) -> bool:
    return bool(request.config.getoption("--update-golden")
                or os.environ.get("TRAINPLAN_UPDATE_GOLDEN") == "1")


def normalized(x):
    """Floats rounded to SIGNIFICANT digits, everything else as is."""
    if isinstance(x, float):
        return float(f"{x:.{SIGNIFICANT}g}")
    if isinstance(x, dict):
        return {k: normalized(v) for k, v in x.items()}
    if isinstance(x, list):
        return [normalized(v) for v in x]
    return x


def golden_json(name: str) -> str:
    return json.dumps(normalized(example_doc(name)), indent=2) + "\n"


def golden_md(name: str) -> str:
    return plan_markdown(None, doc=example_doc(name))


def check(path: Path, text: str, update: bool) -> None:
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"{path} is missing. Create it with `python -m pytest tests/test_golden.py "
                    "--update-golden`, read it, and commit it.")
    old = path.read_text(encoding="utf-8")
    if old != text:
        diff = list(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                         f"golden/{path.name}", "now"))
        pytest.fail(f"{path.name} differs from what the code produces now ({len(diff)} diff lines). "
                    "If the change is intended, run `python -m pytest tests/test_golden.py "
                    "--update-golden` and commit the new file with the change.\n"
                    + "".join(diff[:80]))


@pytest.mark.parametrize("name", EXAMPLES)
def test_markdown_report_matches_golden(name, update):
    check(GOLDEN / f"{name}.md", golden_md(name), update)


@pytest.mark.parametrize("name", EXAMPLES)
def test_json_plan_matches_golden(name, update):
    check(GOLDEN / f"{name}.json", golden_json(name), update)


@pytest.mark.parametrize("name", list(BENCH))
def test_bench_plan_json_matches_golden(name, update):
    """The other plans scripts/bench_plan.py times, field for field (issue 41: faster, the same
    numbers): the multi-node example on 16 H100s."""
    check(GOLDEN / "bench" / f"{name}.json", golden_json(name), update)


@pytest.mark.skipif(os.environ.get("TRAINPLAN_SLOW_GOLDEN") != "1",
                    reason="seconds to minutes each from a cold store: TRAINPLAN_SLOW_GOLDEN=1")
@pytest.mark.parametrize("name", list(SLOW_BENCH))
def test_plans_over_every_platform_match_golden(name, update):
    """The plans over every platform that scripts/bench_plan.py times (GraphMER-SE and the two
    LLM jobs), field for field;
    `TRAINPLAN_SLOW_GOLDEN=1 python -m pytest tests/test_golden.py` (about 2 min on 2 cores from a
    cold store; scripts/bench_plan.py says so too)."""
    check(GOLDEN / "bench" / f"{name}.json", golden_json(name), update)


TIME_OF_DAY = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d")      # a timestamp, not a catalog date


RUN_DEPENDENT_KEYS = ("wall", "elapsed", "trace_seconds", "timestamp", "created", "generated")


def _keys(x):
    if isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _keys(v)
    elif isinstance(x, list):
        for v in x:
            yield from _keys(v)


@pytest.mark.parametrize("name", EXAMPLES)
def test_goldens_hold_no_timestamps_or_wall_times(name):
    for text in (golden_md(name), golden_json(name)):
        assert not TIME_OF_DAY.search(text)
    bad = [k for k in _keys(example_doc(name)) if any(w in k for w in RUN_DEPENDENT_KEYS)]
    assert not bad, bad


def test_normalized_rounds_floats_only():
    assert normalized({"a": [0.1 + 0.2, 3, "x", None, True]}) == {"a": [0.3, 3, "x", None, True]}
    assert normalized(1234567.891234567) == 1234567.891
