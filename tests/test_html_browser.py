"""The HTML reports of the three examples, opened in a real headless browser (Debian's chromium).

Checked: the page loads with no console message, no uncaught exception and no failed resource
load; every chart renders (a screenshot of each <svg> that is not blank and shows the chart's
own colours); and every number the page shows, read from the rendered DOM, equals the JSON
that `trainplan plan --format json` prints for the same job (to the precision shown).

The browser is driven with the Chrome DevTools protocol over `--remote-debugging-pipe` (JSON
messages separated by NUL bytes on file descriptors 3 and 4), which needs nothing beyond the
standard library; screenshots are decoded with Pillow. Skipped when /usr/bin/chromium is absent
(`apt-get install -y chromium`; .ci/run installs it when it can).
"""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from plan_examples import EXAMPLES, example_doc

from trainplan.report import charts
from trainplan.report.plan_html import plan_html
from trainplan.report.plan_tables import fmt_value
from trainplan.report.plan_document import resolve

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs /usr/bin/chromium (apt-get install -y chromium)")
Image = pytest.importorskip("PIL.Image", reason="needs Pillow: pip install -e '.[test]'")


class Browser:
    """Headless chromium driven by the DevTools protocol over a pipe."""

    def __init__(self, width: int = 1280, height: int = 1000):
        r_cmd, self._w = os.pipe()          # we write commands, chromium reads them on fd 3
        self._r, w_res = os.pipe()          # chromium writes replies on fd 4, we read them
        self._profile = tempfile.mkdtemp(prefix="trainplan-chromium-")

        def fds_3_and_4():                  # in the child, before exec
            a = fcntl.fcntl(r_cmd, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(w_res, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--hide-scrollbars", "--disable-dev-shm-usage", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            close_fds=False, preexec_fn=fds_3_and_4, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r_cmd)
        os.close(w_res)
        self._buf, self._id, self.events = b"", 0, []

    def _message(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._message(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, session: str, timeout: float = 60) -> dict:
        end = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method and e.get("sessionId") == session:
                    return self.events.pop(i)
            self.events.append(self._message(end - time.monotonic()))

    def open(self, path: Path) -> "Tab":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        self.wait_for("Page.loadEventFired", session)
        self.send("Runtime.evaluate", {"expression": "document.fonts.ready", "awaitPromise": True},
                  session=session)
        return Tab(self, target, session)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


class Tab:
    def __init__(self, browser: Browser, target: str, session: str):
        self.b, self.target, self.session = browser, target, session

    def eval(self, expression: str):
        r = self.b.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                        session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(r["exceptionDetails"])
        return r["result"].get("value")

    def problems(self) -> list[str]:
        """Console messages, uncaught exceptions and failed loads this page produced."""
        out = []
        for e in self.b.events:
            if e.get("sessionId") != self.session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled":
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value")) for a in p["args"]))
            elif e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']}")
        return out

    def screenshot(self, clip: dict | None = None):
        params = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        data = self.b.send("Page.captureScreenshot", params, session=self.session)["data"]
        return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")

    def close(self) -> None:
        self.b.send("Target.closeTarget", {"targetId": self.target})


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The HTML report of each example, written from the CLI's JSON document."""
    d = tmp_path_factory.mktemp("html")
    out = {}
    for name in EXAMPLES:
        path = d / f"{name}.html"
        path.write_text(plan_html(None, doc=example_doc(name)), encoding="utf-8")
        out[name] = path
    return out


# --- reading numbers back as they are shown ---------------------------------------------------------

UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "ms": 1e-3, "s": 1, "min": 60, "h": 3600,
        "days": 86400, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "": 1}


def shown(text: str, fmt: str) -> tuple[float, float]:
    """(value in the JSON's unit, half a unit in the last digit shown) of a displayed number:
    the reverse of units.py's formats, written independently of them."""
    m = re.fullmatch(r"(\$?)(-?[\d,]*\.?\d+)(%?)\s?([A-Za-z]*)", text.strip())
    assert m, f"not a number as the report shows one: {text!r}"
    dollar, digits, pct, unit = m.groups()
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    scale = UNIT[unit] / (100 if pct else 1)
    return float(digits.replace(",", "")) * scale, 0.5 * 10 ** -decimals * scale * 1.0001


def test_number_reader_reverses_the_formats():
    assert shown("5.31 GiB", "bytes") == (5.31 * 2**30, pytest.approx(0.005 * 2**30, rel=1e-3))
    assert shown("69.2 min", "s")[0] == pytest.approx(4152)
    assert shown("$1,234.50", "usd")[0] == 1234.5
    assert shown("37.5%", "percent")[0] == pytest.approx(0.375)
    assert shown("137.96M", "count")[0] == pytest.approx(137.96e6)


# --- the tests -------------------------------------------------------------------------------------

def test_the_error_detector_sees_errors(browser, tmp_path):
    """Negative control: a page with a console error, an exception and a missing image."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="missing.png"><script>'
                   'console.error("deliberate"); notDefined();</script></body></html>')
    tab = browser.open(bad)
    problems = tab.problems()
    tab.close()
    assert any("console.error: deliberate" in p for p in problems)
    assert any(p.startswith("exception:") for p in problems)
    assert any("Failed to load resource" in p for p in problems)


@pytest.mark.parametrize("name", EXAMPLES)
def test_report_loads_without_console_errors_and_charts_render(browser, pages, name, tmp_path):
    tab = browser.open(pages[name])
    try:
        assert tab.problems() == []
        boxes = tab.eval("""Array.from(document.querySelectorAll('svg.chart')).map(s => {
            const r = s.getBoundingClientRect();
            return {id: s.dataset.chart, x: r.left + scrollX, y: r.top + scrollY,
                    width: r.width, height: r.height}; })""")
        doc = example_doc(name)
        expected = {"memory"} | ({"time", "cost"} if any(p["sessions"] for p in doc["platforms"]
                                                        if p["verdict"] != "RETIRED") else set())
        expected |= {f"curve-{c['platform_id']}" for c in doc["memory_vs_micro_batch"]}
        if any(p.get("campaign") for p in doc["platforms"]):
            expected.add("campaign-cost")
        assert {b["id"] for b in boxes} == expected
        for box in boxes:
            assert box["width"] > 300 and box["height"] > 100, box
            img = tab.screenshot({k: box[k] for k in ("x", "y", "width", "height")})
            img.save(tmp_path / f"{name}-{box['id']}.png")
            assert_not_blank(img, box["id"])
        page = tab.screenshot()
        assert_not_blank(page, "page")
    finally:
        tab.close()


def _has_colour(img, hex_colour: str, tolerance: int = 24) -> bool:
    target = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    small = img.copy()
    small.thumbnail((400, 400))          # fewer pixels to scan; solid marks survive
    return any(all(abs(c - t) <= tolerance for c, t in zip(px, target))
               for _, px in small.getcolors(maxcolors=1 << 20))


def assert_not_blank(img, what: str) -> None:
    colours = img.getcolors(maxcolors=1 << 20)
    assert len(colours) >= 8, f"{what}: only {len(colours)} colours"
    white = sum(n for n, px in colours if min(px) >= 245)
    ink = 1 - white / (img.width * img.height)
    assert ink >= 0.02, f"{what}: {ink:.1%} of the pixels are not white"
    if what != "page":
        assert _has_colour(img, charts.PALETTE[0]), f"{what}: no mark in the chart's first colour"
    if what == "memory" or what.startswith("curve-"):
        assert _has_colour(img, charts.CAPACITY_COLOUR), f"{what}: no capacity line"


@pytest.mark.parametrize("name", EXAMPLES)
def test_numbers_shown_equal_the_json(browser, pages, name):
    doc = example_doc(name)
    tab = browser.open(pages[name])
    try:
        cells = tab.eval("""Array.from(document.querySelectorAll('[data-json-path]')).map(
            e => [e.dataset.jsonPath, e.dataset.format, e.innerText])""")
        embedded = json.loads(tab.eval("document.getElementById('plan-json').textContent"))
    finally:
        tab.close()
    assert embedded == doc
    assert len(cells) >= 40, f"only {len(cells)} numbers tagged"
    for path, fmt, text in cells:
        value = resolve(doc, path)
        assert text == fmt_value(fmt, value), (path, text)
        number, half_ulp = shown(text, fmt)
        assert abs(number - value) <= half_ulp + 1e-9, (path, text, value)
    paths = {p for p, _, _ in cells}
    for i, p in enumerate(doc["platforms"]):
        assert f"platforms[{i}].device_used_bytes" in paths
        if p["sessions"]:
            assert f"platforms[{i}].sessions.finish_s" in paths and f"platforms[{i}].cost.total_usd" in paths
