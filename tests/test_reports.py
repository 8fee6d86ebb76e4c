"""Plan reports: Markdown structure, self-contained HTML with charts, the JSON contract, the
terminal report, and the chart geometry. On a tiny job (traced in about a second) planned on
three platforms, plus variants of that plan where nothing fits or many platforms are listed."""
from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest
from rich.console import Console

from conftest import tiny_job
from plan_examples import TINY
import trainplan.trace.derive.cache as cache_mod
import trainplan.trace.derive.inference as forwards_mod
import trainplan.trace.derive.schedule as schedule_mod
from trainplan.algorithm import Rollout
from trainplan.cli.main import main
from trainplan.plan import Planner, make_plan, select_platforms
from trainplan.report import charts
from trainplan.plan.extras import curve_batches, plan_extras
from trainplan.report.plan_document import document, resolve
from trainplan.report.plan_html import plan_html
from trainplan.report.plan_markdown import SECTIONS, plan_markdown
from trainplan.report.plan_rich import plan_rich, tracing_progress
from trainplan.report.plan_tables import fmt_value
from trainplan.jobfile import load_job
from trainplan.units import (GiB, fmt_bytes, fmt_seconds, fmt_tick, gib, nice_ticks,
                             time_unit)

PLATFORMS = ["kaggle-t4x2", "local-rtx-3090", "kaggle-p100"]     # 2 GPUs, 1 GPU, retired


@pytest.fixture(scope="module")
def job_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("job") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


@pytest.fixture(scope="module")
def planned(job_file):
    job = load_job(job_file)
    platforms = select_platforms(PLATFORMS)
    planner = Planner(job)
    plan = make_plan(job, platforms, planner=planner)
    return plan, plan_extras(plan, platforms, planner)


@pytest.fixture(scope="module")
def doc(planned):
    return document(*planned)


def nothing_fits(plan):
    """The same plan as if no platform could run the job."""
    gone = tuple(replace(p, verdict="WON'T FIT", fits=False, sessions=None, storage=None, cost=None,
                         reason="needs more memory") for p in plan.platforms)
    return replace(plan, platforms=gone, winner=None, recommendation="no platform fits this job")


# --- Markdown ------------------------------------------------------------------------------------

def test_markdown_leads_with_the_verdict_then_sections_in_order(planned, doc):
    md = plan_markdown(*planned)
    lines = md.splitlines()
    assert lines[0] == "# Training plan: tiny"
    first_section = md.index("\n## ")
    assert "**Verdict:**" in md[:first_section] and "**Recommendation:**" in md[:first_section]
    assert f"**{doc['winner']}**" in md[:first_section]
    heads = [ln[3:] for ln in lines if ln.startswith("## ")]
    assert heads == [s for s in SECTIONS if s != "Campaign"]     # no campaign asked


def test_markdown_tables_show_the_plans_numbers(planned, doc):
    md = plan_markdown(*planned)
    verdicts = md.split("## Verdicts")[1].split("\n## ")[0]
    for p in doc["platforms"]:
        row = next(ln for ln in verdicts.splitlines() if f"| {p['platform_id']} |" in ln)
        assert fmt_bytes(p["device_used_bytes"]) in row and p["verdict"] in row
        if p["sessions"]:
            assert fmt_seconds(p["sessions"]["finish_s"]) in row
    # the memory terms of each platform add up to its device total (the table says so)
    for p in doc["platforms"]:
        assert sum(p["memory_breakdown_bytes"].values()) == p["device_used_bytes"]


def test_markdown_of_a_plan_where_nothing_fits(planned):
    plan, extras = planned
    md = plan_markdown(nothing_fits(plan), extras)
    assert "**Verdict:** no platform qualifies" in md
    assert "No platform runs the job" in md
    assert [ln[3:] for ln in md.splitlines() if ln.startswith("## ")] == [
        s for s in SECTIONS if s != "Campaign"]


# --- HTML ----------------------------------------------------------------------------------------

class Page(HTMLParser):
    """Tags, attributes, the numbers tagged with data-json-path, and the embedded JSON."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.numbers: list[tuple[str, str, str]] = []       # (path, format, text)
        self._open: list[tuple[str, str] | None] = []
        self._text: list[str] = []
        self.scripts: list[tuple[dict, str]] = []
        self._script: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "script":
            self._script, self._text = a, []
        if "data-json-path" in a:
            self._open.append((a["data-json-path"], a.get("data-format", "")))
            self._text = []

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._text)))
            self._script = None
        elif tag in ("td", "span") and self._open:
            path, fmt = self._open.pop()
            self.numbers.append((path, fmt, "".join(self._text).strip()))

    def handle_data(self, data):
        self._text.append(data)


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    return p


def test_html_is_self_contained(planned):
    html = plan_html(*planned)
    assert not re.search(r"https?://", html)
    page = parse(html)
    ids = {attrs["id"] for _, attrs in page.tags if "id" in attrs}
    for tag, attrs in page.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        if tag == "a" and set(attrs) == {"href"}:       # only links within the page (sources)
            assert attrs["href"].startswith("#") and attrs["href"][1:] in ids, attrs
            continue
        for name in ("src", "href", "xlink:href", "action"):
            assert name not in attrs, (tag, attrs)
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)    # no inline handlers
    assert "url(" not in html and "@import" not in html
    assert [a.get("type") for a, _ in page.scripts] == ["application/json"]  # data, never code


def test_html_numbers_are_the_json_numbers(planned, doc):
    page = parse(plan_html(*planned))
    embedded = json.loads(page.scripts[0][1])
    assert embedded == json.loads(json.dumps(doc))
    assert len(page.numbers) > 60
    for path, fmt, text in page.numbers:
        assert text == fmt_value(fmt, resolve(doc, path)), path
    paths = {p for p, _, _ in page.numbers}
    for i, p in enumerate(doc["platforms"]):          # every platform's headline numbers are shown
        assert f"platforms[{i}].device_used_bytes" in paths
        assert f"platforms[{i}].capacity_bytes" in paths


def test_html_has_every_chart_with_units(planned, doc):
    html = plan_html(*planned)
    charts_ = dict(re.findall(r'<svg class="chart" data-chart="([^"]+)"(.*?)</svg>', html, re.S))
    curves = [c["platform_id"] for c in doc["memory_vs_micro_batch"]]
    assert curves, "the tiny plan has memory curves"
    assert set(charts_) == {"memory", "time", "cost", *(f"curve-{c}" for c in curves)}
    assert "GiB per device" in charts_["memory"] and "capacity" in charts_["memory"]
    assert "time to finish (" in charts_["time"]
    assert "total cost (USD)" in charts_["cost"] and "time to finish (" in charts_["cost"]
    for c in curves:
        body = charts_[f"curve-{c}"]
        assert "micro-batch per device" in body and "GiB per device" in body
        assert "capacity" in body and "planned" in body


def test_html_of_a_plan_where_nothing_fits_still_renders(planned):
    plan, extras = planned
    html = plan_html(nothing_fits(plan), extras)
    assert 'data-chart="memory"' in html                 # memory is known even when it won't fit
    assert html.count('class="empty"') == 2              # no time or cost to chart
    assert "no platform qualifies" in html


# --- JSON ------------------------------------------------------------------------------------------

UNIT_SUFFIXES = ("_bytes", "_s", "_usd", "_per_s", "_per_hour", "_per_h", "_per_month",
                 "_per_session", "_hours", "_weeks")
# Dimensionless numbers (counts, ratios): the only numeric keys without a unit in their name.
COUNTS = {"accelerator_count", "batch_size", "micro_batch_size", "planned_micro_batch_size",
          "max_micro_batch_size", "measurements",
          "per_device_batch", "global_batch_size", "target_batch", "grad_accum", "devices",
          "cpu_cores", "steps", "checkpoint_every_steps", "sessions", "rank", "seq_len",
          "image_size", "lora_rank", "params_total", "params_trainable", "files_per_checkpoint",
          "checkpoints_fit_disk", "checkpoints_fit_files", "output_file_limit", "dataset_size",
          "epochs", "months", "compute_units", "mfu", "fit_margin",   # fit_margin: a fraction
          "p95", "rows", "fit_probability",        # the verdict's band: fractions and a count
          "max_micro_batch_size_with_band"}


def numeric_keys(x, parent=""):
    if isinstance(x, dict):
        for k, v in x.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                yield parent, k
            yield from numeric_keys(v, k)
    elif isinstance(x, list):
        for v in x:
            yield from numeric_keys(v, parent)


def test_json_numbers_carry_their_unit_in_the_key(doc):
    bad = [(parent, k) for parent, k in numeric_keys(doc)
           if not (k.endswith(UNIT_SUFFIXES) or parent.endswith(("_bytes", "_s"))
                   or k in COUNTS)]
    assert not bad, f"numeric keys without a unit: {bad}"


def test_json_keys_are_stable(doc):
    assert list(doc)[0] == "schema_version" and doc["schema_version"] == "1.5"
    assert {"max_micro_batch_size", "required_bytes", "precision_label", "strategy_label",
            "calibration"} <= set(doc["platforms"][0])
    assert set(doc) == {"schema_version", "job", "steps", "steps_source", "epochs", "dataset_size",
                        "target_batch", "optimize", "budget_usd", "deadline_s", "platforms",
                        "winner", "recommendation", "assumptions", "notes", "campaign",
                        "memory_vs_micro_batch", "catalog"}
    assert set(doc["memory_vs_micro_batch"][0]) == {
        "platform_id", "accelerator_id", "devices", "grad_accum", "capacity_bytes",
        "planned_micro_batch_size", "per_device_batch", "points"}
    assert set(doc["memory_vs_micro_batch"][0]["points"][0]) == {
        "micro_batch_size", "device_used_bytes", "fits", "interpolated"}
    assert {"platform_id", "platform_as_of", "accelerator_as_of", "sources"} <= set(doc["catalog"][0])


def test_memory_curve_agrees_with_the_plan(doc):
    for c in doc["memory_vs_micro_batch"]:
        p = next(x for x in doc["platforms"] if x["platform_id"] == c["platform_id"])
        pts = c["points"]
        b = [q["micro_batch_size"] for q in pts]
        assert b == sorted(set(b)) and len(b) >= 2    # the anchors' line, as the plan traced it
        at_plan = next(q for q in pts if q["micro_batch_size"] == p["micro_batch_size"])
        assert at_plan["device_used_bytes"] == p["device_used_bytes"]
        used = [q["device_used_bytes"] for q in pts]
        assert used == sorted(used)                               # more batch never needs less
        assert all(q["fits"] == (q["device_used_bytes"] <= c["capacity_bytes"]) for q in pts)


@pytest.mark.parametrize("algorithm", ["sft", "grpo"])
def test_memory_curves_take_no_trace_the_plan_did_not(algorithm, monkeypatch):
    """plan/extras.py: the curves read the plan's traces only (training steps and, for a
    generating job, its rollout's forwards); a micro-batch that would need another is left out."""
    monkeypatch.setenv("TRAINPLAN_TRACE_CACHE", "off")
    kw = dict(algorithm="grpo", seq_len=None,
              rollout=Rollout(generations=2, prompt_len=24, completion_len=8)) \
        if algorithm == "grpo" else {}
    job = tiny_job(batch_size=4, steps=10, **kw)
    platforms = select_platforms(["kaggle-t4x2", "local-rtx-3090"])
    planner = Planner(job)
    plan = make_plan(job, platforms, planner=planner)
    made = planner.traces.traced

    def refuse(*a, **k):
        raise AssertionError("a memory curve asked for a new trace")
    for mod, name in ((cache_mod, "trace_all"), (schedule_mod, "trace_all"),
                      (forwards_mod, "trace_all")):
        monkeypatch.setattr(mod, name, refuse)
    curves = plan_extras(plan, platforms, planner).memory_curves
    assert planner.traces.traced == made
    assert curves or algorithm == "grpo"      # a rollout at another batch needs new forwards
    for c in curves:
        p = next(x for x in plan.platforms if x.platform_id == c.platform_id)
        assert p.micro_batch_size in [q.micro_batch_size for q in c.points]


def test_a_curve_point_is_the_evaluations_memory_without_its_step_time(monkeypatch):
    """plan/planner.py `memory`: a training job's curve point is the memory `evaluate` gives at
    that micro-batch (and whether its trace is read off the anchors' line), made without
    predicting the step time (predict/evaluate.py `step_memory`); a generating job's memory
    rests on its rollout's phases, so it is evaluated whole."""
    import importlib
    from trainplan.plan.extras import _variant
    # the module: the package's `evaluate` attribute is the function
    evaluate_mod = importlib.import_module("trainplan.predict.evaluate")
    job = tiny_job(batch_size=4, steps=10)
    platforms = select_platforms(["kaggle-t4x2", "local-rtx-3090"])
    planner = Planner(job)
    plan = make_plan(job, platforms, planner=planner)
    timed, real = [], evaluate_mod.estimate_step_time
    monkeypatch.setattr(evaluate_mod, "estimate_step_time",
                        lambda *a, **k: timed.append(a[2].batch_size) or real(*a, **k))
    curves = plan_extras(plan, platforms, planner).memory_curves
    assert curves and timed == []
    monkeypatch.undo()
    by_id = {p.id: p for p in platforms}
    for c in curves:
        pp = next(x for x in plan.platforms if x.platform_id == c.platform_id)
        jv = _variant(planner, by_id[c.platform_id], pp)
        for q in c.points:
            ev = evaluate_mod.evaluate(jv.with_(batch_size=q.micro_batch_size), by_id[
                c.platform_id].accelerator, traces=planner.traces, strict=False)
            assert (q.device_used_bytes, q.fits, q.interpolated) == (
                ev.memory.device_used_bytes, ev.memory.fits, ev.interpolated)
    grpo = tiny_job(batch_size=4, steps=10, algorithm="grpo", seq_len=None,
                    rollout=Rollout(generations=2, prompt_len=24, completion_len=8))
    assert evaluate_mod.step_memory(grpo, platforms[0].accelerator, planner.traces) is None


def test_curve_batches():
    assert curve_batches(16, 16, False) == [1, 5, 10, 14, 16, 19, 23, 28, 32]   # to 2P
    assert curve_batches(16, 8, True)[-1] == 15                                 # to P - 1
    assert curve_batches(1, 1, False) == list(range(1, 9))                     # at least to 8
    assert 8 in curve_batches(32, 8, True)


# --- terminal ------------------------------------------------------------------------------------

def test_terminal_report_puts_verdict_and_table_first(planned, doc):
    con = Console(file=io.StringIO(), width=140, force_terminal=False)
    plan_rich(*planned, console=con)
    out = con.file.getvalue()
    head = "\n".join(out.splitlines()[:20])
    assert doc["winner"] in head and "Recommendation:" in head and "Verdicts" in head
    assert "\x1b[" not in out                                       # no colour when not a terminal
    assert "Launch checklist" in out and "Memory per device" in out


def test_terminal_colour_only_where_supported(planned, monkeypatch):
    colour = Console(file=io.StringIO(), width=140, force_terminal=True, color_system="standard")
    plan_rich(*planned, console=colour)
    assert "\x1b[" in colour.file.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = Console(file=io.StringIO(), width=140, force_terminal=True)
    plan_rich(*planned, console=plain)
    assert not re.search(r"\x1b\[[0-9;]*3\dm", plain.file.getvalue())   # no foreground colours


def test_terminal_report_with_many_platforms(planned):
    plan, extras = planned
    many = tuple(replace(plan.platforms[0], platform_id=f"p{i}", rank=i + 1) for i in range(20))
    con = Console(file=io.StringIO(), width=140, force_terminal=False)
    plan_rich(replace(plan, platforms=many), extras, console=con)
    out = con.file.getvalue()
    assert "8 more platforms below" in out and "The other platforms" in out


def test_progress_shows_only_on_a_terminal():
    with tracing_progress(Console(file=io.StringIO(), force_terminal=False)) as progress:
        assert progress is None
    term = Console(file=io.StringIO(), force_terminal=True, width=100, no_color=True)
    with tracing_progress(term) as progress:
        progress("tracing tiny (batch 4)")
        progress("tracing tiny (batch 8)")
    assert "tracing tiny (batch 4): done" in term.file.getvalue()


# --- CLI -----------------------------------------------------------------------------------------

def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_formats_render_one_document(capsys, job_file, tmp_path):
    report = tmp_path / "plan.html"
    code, out, err = run(capsys, "plan", job_file, "--platforms", "local-rtx-3090",
                         "--format", "json", "--report", str(report))
    assert code == 0, err
    d = json.loads(out)
    assert d["memory_vs_micro_batch"] and d["catalog"]
    page = parse(report.read_text())
    assert json.loads(page.scripts[0][1]) == d
    code, md, err = run(capsys, "plan", job_file, "--platforms", "local-rtx-3090", "--format", "md")
    assert code == 0, err
    assert md == plan_markdown(None, doc=d)


def test_cli_report_extension_must_name_a_format(capsys, job_file, tmp_path):
    code, _, err = run(capsys, "plan", job_file, "--report", str(tmp_path / "plan.txt"))
    assert code == 2
    assert ".md" in err and ".html" in err and "plan.md" in err


def test_cli_report_never_replaces_a_file_without_force(capsys, job_file, tmp_path):
    """An existing --report file (an earlier report, or the user's own notes.md) is refused
    before any tracing, and replaced with --force; a folder is named as one."""
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    code, _, err = run(capsys, "plan", job_file, "--platforms", "local-rtx-3090", "--report",
                       str(notes))
    assert code == 2 and "exists" in err and "--force" in err
    assert notes.read_text() == "my notes\n"
    code, _, err = run(capsys, "plan", job_file, "--platforms", "local-rtx-3090", "--report",
                       str(notes), "--force")
    assert code == 0, err
    assert notes.read_text().startswith("# Training plan")
    code, _, err = run(capsys, "plan", job_file, "--report", str(tmp_path))
    assert code == 2 and "is a folder" in err and "plan.md" in err


# --- charts and units ----------------------------------------------------------------------------

def _rects(svg: str) -> list[tuple[float, float]]:
    return [(float(x), float(w)) for x, w in re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)" '
                                                        r'height="16"', svg)]


def test_bars_are_proportional_to_their_values():
    svg = charts.bars("t", [charts.Bar("a", 5.0, "5"), charts.Bar("b", 10.0, "10")], "x (h)")
    (xa, wa), (xb, wb) = _rects(svg)
    assert xa == xb and wb == pytest.approx(2 * wa, rel=1e-3)


def test_stacked_bar_segments_add_up_and_capacity_sits_on_the_axis():
    svg = charts.stacked_bars("t", [charts.StackRow("p", (2.0, 3.0, 5.0), 15.0)], ["a", "b", "c"],
                              "GiB")
    segs = _rects(svg)
    widths = [w for _, w in segs]
    assert widths == pytest.approx([2 / 10 * sum(widths), 3 / 10 * sum(widths), 5 / 10 * sum(widths)],
                                   rel=1e-3)
    assert segs[1][0] == pytest.approx(segs[0][0] + segs[0][1], abs=0.02)   # segments touch
    x0 = segs[0][0]
    mx = float(re.search(r'<line x1="([\d.]+)"[^>]*stroke="#C00000" stroke-width="2.5"', svg).group(1))
    assert (mx - x0) / sum(widths) == pytest.approx(15.0 / 10.0, rel=1e-3)  # capacity 15, used 10


def test_line_chart_capacity_line_height():
    svg = charts.line_chart("t", [charts.Series("s", ((1, 2.0), (8, 9.0)))], "b", "GiB",
                            [("capacity", 8.0)])
    ys = [float(y) for y in re.findall(r'<line x1="[\d.]+" y1="([\d.]+)"[^>]*stroke="#C00000" '
                                       r'stroke-width="2" stroke-dasharray="6 3"', svg)]
    x0, x1, y0, y1 = charts._plot_area(charts.WIDTH, 280)
    top = nice_ticks(0, 9.0)[-1]
    assert ys == [pytest.approx(y1 - (y1 - y0) * 8.0 / top, abs=0.01)]


def test_nice_ticks_cover_the_range_in_round_steps():
    for lo, hi in ((0, 15.7), (0, 0.43), (0, 1234), (0, 7), (0, 1e-9), (0, 99.5)):
        t = nice_ticks(lo, hi)
        assert t[0] <= lo and t[-1] >= hi and 2 <= len(t) <= 11
        step = t[1] - t[0]
        mant = step / 10 ** __import__("math").floor(__import__("math").log10(step))
        assert round(mant, 6) in (1, 2, 5, 10)


def test_time_unit_matches_fmt_seconds():
    for s in (30, 119, 600, 7000, 7300, 86400, 3 * 86400 + 1):
        unit, per = time_unit(s)
        assert fmt_seconds(s).endswith(unit)
        assert s / per == pytest.approx(float(fmt_seconds(s).split()[0]), abs=0.051)  # 1 decimal


def test_units_helpers():
    assert fmt_tick(1000) == "1,000" and fmt_tick(2.5) == "2.5" and fmt_tick(0.2) == "0.2"
    assert gib(3 * GiB) == 3
    assert fmt_value("int", 10000) == "10,000" and fmt_value("percent", 0.1887) == "18.9%"
    assert fmt_value("rate", 94.94) == "94.9" and fmt_value("rate", 72909.4) == "72,909"
    assert fmt_value("bool", None) == "-" and fmt_value("bool", False) == "no"
    # no bytes at all (a TPU's gradients at a forward peak, no headroom) read as none, not as an
    # amount rounded down ("0.0 KiB" before)
    assert fmt_bytes(0) == "0 B" and fmt_bytes(512) == "0.5 KiB" and fmt_bytes(3 * GiB) == "3.00 GiB"
