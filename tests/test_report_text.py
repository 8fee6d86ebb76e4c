"""What people read (issue 18, items 3, 4, 6, 9, 10): every report of the three example jobs, of
`catalog`, `estimate` and `inspect`, rendered and read as text.

    3   no raw values: no `None`, no dataclass repr, no `_s:` / `_bytes` labels, no bare counts
    4   at 80 (and 120) columns no line is longer than the terminal, and no id is cut
    6   the summary line and the per-platform marks come from one decision (plan/verdict.py);
        bf16 on a T4 is a precision change, not DOES NOT FIT
    9   the HTML cost chart's labels do not overlap; sources are links to the sources table
    10  the terminal shows the information-level findings the HTML shows

The examples are planned once per session (`plan_examples.example_doc`, shared with the golden
and browser tests) and rendered from their JSON document; JSON itself is exempt from item 3.
"""
from __future__ import annotations

import copy
import io
import re
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
from rich.console import Console

from plan_examples import EXAMPLES, example_doc
from trainplan.cli.main import main
from trainplan.plan.result import READY_WITH_CHANGES, TIGHT, WONT_FIT
from trainplan.plan.verdict import headline, estimate_verdict
from trainplan.predict.memory import FITS, NO_FIT
from trainplan.report import charts
from trainplan.report.console import Col, console, fit_table
from trainplan.report.plan_html import cost_chart, plan_html
from trainplan.report.plan_markdown import plan_markdown
from trainplan.report.plan_rich import plan_rich
from trainplan.units import fmt_note, key_label

GPT2 = ["--model", "hf:openai-community/gpt2", "--gpu", "t4", "--seq-len", "512",
        "--batch-size", "8"]

# --- item 3: the leak detector -------------------------------------------------------------------

LEAKS = (
    (re.compile(r"\bNone\b"), "the word None"),
    (re.compile(r"\b\w+\(\w+="), "a dataclass repr"),
    (re.compile(r"\w_s:|\w_bytes\b"), "a field name with its unit suffix"),
    (re.compile(r"\w=\{"), "a dict repr"),
    (re.compile(r"\bnone activation checkpointing"), "a raw setting value in a sentence"),
    # a bare integer of 5+ digits (not part of an id, a version, a path or a formatted number)
    (re.compile(r"(?<![\w.\-/#:,$~])\d{5,}(?![\w.,\-/])"), "an unformatted count"),
)


def leaks(text: str) -> list[str]:
    return [f"{what}: {line.strip()[:140]!r}" for line in text.splitlines()
            for rx, what in LEAKS if rx.search(line)]


class Visible(HTMLParser):
    """The text a browser shows: no tags, no attributes, no <script>/<style>; the sources table
    (verbatim quotations of data/SOURCES.md) is left out, as quoted material."""

    SKIP = ("script", "style")

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0
        self.depth_sources = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        if tag == "table" and dict(attrs).get("id") == "sources":
            self.depth_sources = 1
        if tag in ("tr", "p", "li", "h1", "h2", "h3", "text", "title", "figcaption"):
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" | ")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip -= 1
        if tag == "table" and self.depth_sources:
            self.depth_sources = 0

    def handle_data(self, data):
        if not self.skip and not self.depth_sources:
            self.parts.append(data)


def visible(html: str) -> str:
    v = Visible()
    v.feed(html)
    return "".join(v.parts)


def terminal(doc: dict, width: int) -> str:
    con = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    plan_rich(None, console=con, doc=doc)
    return con.file.getvalue()


def too_long(text: str, width: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > width]


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return request.param, example_doc(request.param)


def test_plan_reports_leak_no_raw_values(example):
    name, doc = example
    for fmt, text in (("text", terminal(doc, 80)), ("text", terminal(doc, 120)),
                      ("md", plan_markdown(None, doc=doc)), ("html", visible(plan_html(None, doc=doc)))):
        assert not leaks(text), f"{name} {fmt}: " + "\n".join(leaks(text)[:10])


@pytest.mark.parametrize("width", [80, 120])
def test_plan_terminal_fits_the_width_and_keeps_ids_whole(example, width):
    name, doc = example
    out = terminal(doc, width)
    assert not too_long(out, width), f"{name} at {width}: {too_long(out, width)[:3]}"
    assert "…" not in out, f"{name}: something was cut with an ellipsis"
    table = out[out.index("Verdicts, best first"):out.index("Memory per device")]
    for p in doc["platforms"][:12]:
        assert re.search(rf"(^|\s){re.escape(p['platform_id'])}(\s|$)", table, re.M), \
            f"{name}: {p['platform_id']} not whole in the verdicts table"


# --- item 10: information-level findings on the terminal -----------------------------------------

def test_terminal_shows_the_info_findings_the_html_shows(example):
    name, doc = example
    out = " ".join(terminal(doc, 80).split())          # undo the wrapping
    html = plan_html(None, doc=doc)
    chosen = next(p for p in doc["platforms"] if p["platform_id"] == headline(doc).platform_id)
    infos = [f["message"] for f in chosen["findings"] if f["severity"] == "info"]
    for m in infos:
        assert m in visible(html).replace("\n", " ") or m.replace("'", "&#x27;") in html
        assert " ".join(m.split()) in out, f"{name}: info finding missing on the terminal: {m}"


def test_examples_have_the_info_findings_of_item_10():
    """The TPU example (fp16 traced as bf16) carries an info finding the terminal must show."""
    doc = example_doc("graphmer-se")
    tpu = [p for p in doc["platforms"] if "tpu" in p["accelerator_id"]]
    assert tpu and any(f["severity"] == "info" for p in tpu for f in p["findings"])
    out = " ".join(terminal(doc, 80).split())
    assert "TPUs compute in bf16" in out


# --- item 6: one decision for the summary line and the marks -------------------------------------

def _platform(pid: str, verdict: str, reason: str = "") -> dict:
    return {"platform_id": pid, "name": pid.upper(), "verdict": verdict, "reason": reason}


def test_headline_never_denies_a_platform_marked_as_running():
    doc = {"winner": None, "platforms": [
        _platform("colab-pro-l4", READY_WITH_CHANGES, "fits only by changing what is trained: LoRA"),
        _platform("kaggle-t4x2", WONT_FIT)]}
    h = headline(doc)
    assert h.verdict == READY_WITH_CHANGES and h.platform_id == "colab-pro-l4"
    assert "qualif" not in h.text and "LoRA" in h.text
    doc["platforms"][0]["verdict"] = TIGHT
    assert headline(doc).verdict == TIGHT
    doc["platforms"][0]["verdict"] = WONT_FIT
    h = headline(doc)
    assert h.verdict == "" and "no platform qualifies" in h.text and WONT_FIT in h.text


def test_reports_use_the_headline_when_no_platform_is_recommended(example):
    """A plan with no winner (over budget, say) but a platform marked READY WITH CHANGES: every
    format leads with that platform's own mark, never 'no platform qualifies'."""
    name, doc = example
    doc = copy.deepcopy(doc)
    doc["winner"] = None
    runs = next(p for p in doc["platforms"] if p["verdict"] in (READY_WITH_CHANGES, TIGHT, "READY"))
    for text in (terminal(doc, 80), plan_markdown(None, doc=doc), visible(plan_html(None, doc=doc))):
        head = " ".join(text.split())[:600]
        assert "no platform qualifies" not in head
        assert f"{runs['verdict']} on {runs['platform_id']}" in head.replace("*", "")


def _est(fits=True, tight=False, findings=()):
    mem = SimpleNamespace(fits=fits, tight=tight, required_bytes=20 * 2**30, capacity_bytes=15 * 2**30)
    return SimpleNamespace(memory=mem, findings=tuple(findings))


def test_estimate_verdict_separates_memory_from_precision():
    bf16 = SimpleNamespace(severity="error", kind="precision", blocks=True,
                           message="t4 has no bf16", fix="use --precision fp16-amp")
    assert estimate_verdict(_est())[0] == FITS.upper() == "FITS"
    assert estimate_verdict(_est(fits=False))[0] == NO_FIT.upper() == "DOES NOT FIT"
    word, why = estimate_verdict(_est(findings=[bf16]))
    assert word == READY_WITH_CHANGES and "fp16-amp" in why
    word, why = estimate_verdict(_est(fits=False, findings=[bf16]))
    assert word == NO_FIT.upper() and "GiB" in why                      # memory decides first


# --- the CLI: catalog, estimate, inspect at 80 columns ---------------------------------------------

@pytest.fixture
def cols80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TRAINPLAN_JOBS", "1")
    console.cache_clear()
    yield 80
    console.cache_clear()


def run(capsys, *argv) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("what", ["models", "platforms", "accelerators"])
def test_catalog_fits_80_columns_with_ids_whole(capsys, cols80, what):
    out = run(capsys, "catalog", what)
    assert not too_long(out, 80), too_long(out, 80)[:3]
    assert not leaks(out), leaks(out)[:5]
    assert "…" not in out
    if what == "models":
        from trainplan.models.hf_names import bundled_index
        ids = [r["hub_id"] for r in bundled_index().values()]
    elif what == "platforms":
        from trainplan.platforms import load_platforms
        ids = list(load_platforms(None))
    else:
        from trainplan.accelerators import load_accelerators
        ids = list(load_accelerators())
    lines = out.splitlines()
    for i in ids:
        assert any(re.match(rf"{re.escape(i)}(\s|$)", ln) for ln in lines), f"{i} not whole"


def test_catalog_models_prints_every_parameter_count(capsys, cols80):
    out = run(capsys, "catalog", "models")
    for pid in ("microsoft/deberta-v3-base", "microsoft/deberta-v3-large",
                "stabilityai/stablelm-2-1_6b", "openai-community/gpt2"):
        line = next(ln for ln in out.splitlines() if ln.startswith(pid + " "))
        assert re.search(r"\d+\.\d\d[KMB]", line), line
    assert "184.55M (built)" in out and "params (built):" in out
    assert "124.44M" in out                               # published: 124439808


def test_estimate_and_inspect_fit_80_columns(capsys, cols80):
    for argv in (["estimate", *GPT2, "--precision", "fp16-amp"],
                 ["inspect", *GPT2, "--precision", "fp16-amp"]):
        out = run(capsys, *argv)
        assert not too_long(out, 80), (argv[0], too_long(out, 80)[:3])
        assert not leaks(out), (argv[0], leaks(out)[:5])


def test_estimate_bf16_on_a_t4_is_a_precision_change_not_a_memory_verdict(capsys, cols80):
    out = run(capsys, "estimate", *GPT2, "--precision", "bf16-amp")
    head = " ".join(out.split())[:400]
    assert "DOES NOT FIT" not in head
    assert "READY WITH CHANGES" in head and "fp16" in head


# --- item 9: the cost chart's labels and the sources links -------------------------------------------

LABEL = re.compile(r'<text x="([\d.]+)" y="([\d.]+)" font-size="([\d.]+)" text-anchor="(\w+)"'
                   r'[^>]*class="point-label">([^<]*)</text>')


def label_boxes(svg: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    out = []
    for x, y, size, anchor, text in LABEL.findall(svg):
        text = text.replace("&amp;", "&")
        out.append((text, charts.label_box(float(x), float(y), anchor, text, float(size))))
    return out


def overlapping(boxes) -> list[tuple[str, str]]:
    return [(a, b) for i, (a, p) in enumerate(boxes) for b, q in boxes[i + 1:]
            if p[0] < q[2] and q[0] < p[2] and p[1] < q[3] and q[1] < p[3]]


def test_cost_chart_labels_do_not_overlap_when_platforms_are_close():
    pts = [charts.Point(f"platform-{i:02d}-long-name", 10 + 0.4 * i, 5 + 0.05 * i) for i in range(9)]
    pts += [charts.Point("same-spot-a", 30, 2), charts.Point("same-spot-b", 30, 2),
            charts.Point("kaggle-t4x2", 0.1, 0.0), charts.Point("colab-free-t4", 0.12, 0.0)]
    svg = charts.scatter("cost", pts, "time (h)", "USD", chart_id="cost")
    boxes = label_boxes(svg)
    assert sorted(t for t, _ in boxes) == sorted(p.label for p in pts)
    assert not overlapping(boxes), overlapping(boxes)
    assert 'class="leader"' in svg                       # moved labels point at their marker
    assert svg == charts.scatter("cost", pts, "time (h)", "USD", chart_id="cost")  # deterministic


def test_cost_chart_of_the_examples_has_no_overlapping_labels(example):
    name, doc = example
    svg = cost_chart(doc)
    if svg is None:
        pytest.skip(f"{name}: nothing to chart")
    boxes = label_boxes(svg)
    assert len(boxes) == len([p for p in doc["platforms"] if p["sessions"] and p["cost"]][:12])
    assert not overlapping(boxes), (name, overlapping(boxes))


def test_sources_are_links_to_the_sources_table(example):
    name, doc = example
    html = plan_html(None, doc=doc)
    cited = {i for r in doc["catalog"] for i in r["sources"]}
    assert cited, f"{name}: the catalog rows cite sources"
    links = set(re.findall(r'<a href="#src-([A-Z]+\d+)">\1</a>', html))
    rows = set(re.findall(r'<tr id="src-([A-Z]+\d+)">', html))
    assert links == cited and rows == cited
    assert 'id="sources"' in html
    for i in cited:                                   # each row quotes its entry of SOURCES.md
        row = html[html.index(f'<tr id="src-{i}">'):]
        assert "not in data/SOURCES.md" not in row[:row.index("</tr>")]


# --- the formatting layer and the layout helper -------------------------------------------------------

def test_units_labels_and_notes():
    assert key_label("session_overhead_s") == "session overhead"
    assert key_label("checkpoint_bytes") == "checkpoint"
    assert key_label("value_of_time_usd_per_h") == "value of waiting time"
    assert key_label("optimizer_states") == "optimizer states"
    note = "not modelled: hgat={'enabled': True, 'relation_bias': True}, use_bias=True (x)"
    assert fmt_note(note) == "not modelled: hgat (enabled, relation bias), use bias: yes (x)"
    assert fmt_note("rank=16 and size=123456") == "rank: 16 and size: 123,456"
    assert fmt_note("plain text, a=b(c)") == "plain text, a=b(c)"


def test_fit_table_drops_low_priority_columns_then_stacks():
    ids = ["organisation/a-long-model-identifier", "short"]
    cols = [Col("id", key=True), Col("kind", priority=1), Col("class", priority=0),
            Col("params", "right", priority=5)]
    rows = [[i, "decoder", "AutoModelForSequenceClassification", "1.23B"] for i in ids]

    def show(width):
        con = Console(file=io.StringIO(), width=width, color_system=None)
        con.print(fit_table(cols, rows, width, "models"))
        return con.file.getvalue()

    wide = show(140)
    assert "AutoModelForSequenceClassification" in wide and "left out" not in wide
    mid = show(80)
    assert not too_long(mid, 80) and "left out at this width: class" in mid
    assert "1.23B" in mid and all(i in mid for i in ids)
    narrow = show(40)                                 # not even id + params fit: stacked rows
    assert not too_long(narrow, 40)
    assert "params: 1.23B" in narrow and all(i in narrow for i in ids)
