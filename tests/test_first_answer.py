"""A plan's first answer (issue 41: "an answer first, then the rest"): the job as written on each
platform, told as soon as the first round of traces gives it, before any fix ladder is climbed;
and its lines as the terminal shows them (stderr, beside the progress: report/plan_rich.py)."""
from __future__ import annotations

from trainplan.plan import Planner, make_plan, select_platforms
from trainplan.plan.result import AsGiven
from trainplan.predict.memory import FITS, NO_FIT, TIGHT
from trainplan.report.plan_rich import AS_GIVEN_ROWS, as_given_lines
from trainplan.spec import Job, validate
from trainplan.units import GiB

# fits an A100 as written; an 8 GiB RTX 3050 holds not even its weights, gradients and AdamW
# state (774M parameters, 16 bytes each): the fix ladder
JOB = validate(Job(model="hf:openai-community/gpt2-large", batch_size=2, seq_len=512,
                   precision="fp16", steps=100))
PLATFORMS = ["colab-pro-a100", "local-rtx-3050"]


def test_the_job_as_written_comes_before_the_fix_ladder():
    platforms = select_platforms(PLATFORMS)
    planner = Planner(JOB)
    events: list = []
    ladder = planner.ladder

    def climbing(*a, **kw):
        events.append("ladder")
        return ladder(*a, **kw)

    planner.ladder = climbing
    plan = make_plan(JOB, platforms, planner=planner, answered=lambda rows: events.append(rows))
    rows = events[0]                             # told first, once; the ladder climbed after it
    assert isinstance(rows, list) and events[1:] and set(events[1:]) == {"ladder"}
    assert [r.platform_id for r in rows] == [p.id for p in platforms]
    by_id = {r.platform_id: r for r in rows}
    assert by_id["colab-pro-a100"].fit_state == FITS
    assert by_id["local-rtx-3050"].fit_state == NO_FIT
    # where the job runs as written, the first answer is the plan's own figure
    a100 = plan.platform("colab-pro-a100")
    assert (a100.micro_batch_size, a100.grad_accum) == (2, 1)
    assert by_id["colab-pro-a100"].step_time_s == a100.step_time_s
    assert by_id["colab-pro-a100"].required_bytes == a100.required_bytes
    assert by_id["local-rtx-3050"].required_bytes > by_id["local-rtx-3050"].capacity_bytes


def _row(i: int, state: str, batch: int = 8) -> AsGiven:
    return AsGiven(f"a-platform-name-25-long-{i}", batch, state, 0.25 + i,
                   int((10 + i) * GiB), 24 * GiB)


def test_a_few_platforms_one_line_each_under_80_columns():
    rows = [_row(0, FITS), _row(1, TIGHT, 16), _row(2, NO_FIT)]
    lines = as_given_lines(rows)
    assert lines[0].startswith("As written (micro-batch a device, time a step,")
    assert len(lines) == 1 + len(rows) + 1
    assert lines[1].split() == ["a-platform-name-25-long-0", "fits", "8", "250.0", "ms",
                                "10.00", "/", "24.00", "GiB"]
    assert lines[2].split()[1:4] == ["tight", "16", "1.25"]
    assert lines[3].split() == ["a-platform-name-25-long-2", "does", "not", "fit", "8",
                                "12.00", "/", "24.00", "GiB"]      # no step time: it does not run
    assert lines[-1] == "Next: the fix ladder where it does not fit (1 platform), then the plan."
    for line in lines:
        assert len(line) <= 80, line
        assert not any(raw in line for raw in ("None", "True", "False", "[", "{"))


def test_every_platform_is_two_summary_lines():
    rows = [_row(i, FITS if i % 3 else NO_FIT) for i in range(AS_GIVEN_ROWS + 4)]
    lines = as_given_lines(rows)
    runs = [r for r in rows if r.fit_state != NO_FIT]
    assert lines == [f"As written, the job fits on {len(runs)} of {len(rows)} platforms.",
                     f"Fastest as written: {runs[0].platform_id}, 1.25 s a step.",
                     f"Next: the fix ladder where it does not fit ({len(rows) - len(runs)} "
                     "platforms), then the plan."]
    assert all(len(line) <= 80 for line in lines)


def test_all_fit_no_next_line():
    lines = as_given_lines([_row(0, FITS)])
    assert len(lines) == 2 and not lines[-1].startswith("Next")
    assert as_given_lines([]) == []
