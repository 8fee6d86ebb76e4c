"""Charts as inline SVG strings: pure functions from numbers to markup, no JavaScript, no network.

The caller converts to display units first (GiB through `units.gib`, time through
`units.time_unit`) and passes the axis label with its unit; these functions only place marks.
Axes start at zero (bar lengths and distances from the axis are then proportional to the
values) and carry round ticks (`units.nice_ticks`). Every mark has a <title> with its value, so
a reader can hover for the exact number; the tables next to the charts carry the same numbers.

The SVG is written for inline use in HTML5 (no xmlns needed there); `standalone()` adds the
namespace for a .svg file. Colours: the Okabe-Ito palette, distinguishable with the common
colour-vision deficiencies (Okabe & Ito, "Color Universal Design", 2008).
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ..units import fmt_tick, nice_ticks

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")
CAPACITY_COLOUR = "#C00000"
WIDTH = 720
FONT = 12
CHAR_W = 6.6          # average glyph width of a 12 px sans-serif font, for label room
ROW_H = 24
BAR_H = 16
TOP = 40              # room for the title and the legend
BOTTOM = 44           # room for the x axis ticks and label


@dataclass(frozen=True)
class StackRow:
    label: str
    values: tuple[float, ...]        # one per series, display units
    marker: float | None = None      # e.g. the device's capacity, same units
    note: str = ""                   # text after the bar


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    note: str = ""


@dataclass(frozen=True)
class Point:
    label: str
    x: float
    y: float


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    highlight: tuple[float, float] | None = None   # one point drawn larger (the plan's choice)
    highlight_label: str = ""


def _n(x: float) -> str:
    """Coordinates with two decimals: deterministic text, sub-pixel precise."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _text(x, y, s, anchor="start", size=FONT, weight="normal", fill="#222", extra="") -> str:
    return (f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}" '
            f'font-weight="{weight}" fill="{fill}"{extra}>{escape(s)}</text>')


def _svg(title: str, height: float, body: list[str], chart_id: str, width: float = WIDTH) -> str:
    head = (f'<svg class="chart" data-chart="{escape(chart_id)}" width="{_n(width)}" '
            f'height="{_n(height)}" viewBox="0 0 {_n(width)} {_n(height)}" role="img" '
            f'aria-label="{escape(title)}" font-family="sans-serif">')
    return "\n".join([head, f"<title>{escape(title)}</title>",
                      f'<rect x="0" y="0" width="{_n(width)}" height="{_n(height)}" fill="#ffffff"/>',
                      _text(8, 18, title, size=14, weight="bold"), *body, "</svg>"])


def standalone(svg: str) -> str:
    """The same chart as a stand-alone SVG document (adds the SVG namespace)."""
    return svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)


def _label_room(labels) -> float:
    return min(240.0, 12 + CHAR_W * max((len(s) for s in labels), default=4))


def _x_axis(x0: float, x1: float, y: float, ticks: list[float], scale, label: str) -> list[str]:
    out = [f'<line x1="{_n(x0)}" y1="{_n(y)}" x2="{_n(x1)}" y2="{_n(y)}" stroke="#444"/>']
    for t in ticks:
        x = scale(t)
        out.append(f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x)}" y2="{_n(y + 4)}" stroke="#444"/>')
        out.append(_text(x, y + 16, fmt_tick(t), anchor="middle"))
    out.append(_text((x0 + x1) / 2, y + 34, label, anchor="middle"))
    return out


def _grid_x(ticks, scale, y0, y1) -> list[str]:
    return [f'<line x1="{_n(scale(t))}" y1="{_n(y0)}" x2="{_n(scale(t))}" y2="{_n(y1)}" '
            f'stroke="#e4e4e4"/>' for t in ticks]


def _legend(items: list[tuple[str, str, str]], x: float, y: float) -> list[str]:
    """(name, colour, kind) with kind 'box' or 'line' (dashed), laid out left to right."""
    out = []
    for name, colour, kind in items:
        if kind == "box":
            out.append(f'<rect x="{_n(x)}" y="{_n(y - 9)}" width="10" height="10" fill="{colour}"/>')
        else:
            out.append(f'<line x1="{_n(x)}" y1="{_n(y - 4)}" x2="{_n(x + 12)}" y2="{_n(y - 4)}" '
                       f'stroke="{colour}" stroke-width="2" stroke-dasharray="4 2"/>')
        out.append(_text(x + 15, y, name, size=11))
        x += 24 + CHAR_W * 0.95 * len(name)
    return out


def stacked_bars(title: str, rows: list[StackRow], series: list[str], x_label: str,
                 marker_name: str = "capacity", chart_id: str = "stacked") -> str:
    """One horizontal bar per row, split into `series` segments, with a vertical marker
    (capacity) across each bar; the row's `note` is written after the bar."""
    left = _label_room(r.label for r in rows)
    right = 12 + CHAR_W * max((len(r.note) for r in rows), default=0)
    x0, x1 = left, WIDTH - max(40.0, right)
    top = TOP + 8
    hi = max([sum(r.values) for r in rows] + [r.marker or 0 for r in rows] + [1e-9])
    ticks = nice_ticks(0, hi)
    scale = lambda v: x0 + (x1 - x0) * v / ticks[-1]  # noqa: E731
    y_axis = top + ROW_H * len(rows) + 4
    body = _legend([(s, PALETTE[i % len(PALETTE)], "box") for i, s in enumerate(series)]
                   + [(marker_name, CAPACITY_COLOUR, "line")], 8, 34)
    body += _grid_x(ticks, scale, top - 4, y_axis)
    for i, r in enumerate(rows):
        y = top + ROW_H * i
        body.append(_text(x0 - 6, y + BAR_H - 3, r.label, anchor="end"))
        x = x0
        for j, v in enumerate(r.values):
            if v <= 0:
                continue
            w = scale(v) - x0
            body.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{BAR_H}" '
                        f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(r.label)}: '
                        f'{escape(series[j])} {fmt_tick(round(v, 2))}</title></rect>')
            x += w
        if r.marker is not None:
            mx = scale(r.marker)
            body.append(f'<line x1="{_n(mx)}" y1="{_n(y - 3)}" x2="{_n(mx)}" y2="{_n(y + BAR_H + 3)}" '
                        f'stroke="{CAPACITY_COLOUR}" stroke-width="2.5" stroke-dasharray="4 2">'
                        f'<title>{escape(marker_name)} {fmt_tick(round(r.marker, 2))}</title></line>')
        if r.note:
            body.append(_text(max(x, scale(r.marker or 0)) + 6, y + BAR_H - 3, r.note, size=11))
    body += _x_axis(x0, x1, y_axis, ticks, scale, x_label)
    return _svg(title, y_axis + BOTTOM, body, chart_id)


def bars(title: str, rows: list[Bar], x_label: str, chart_id: str = "bars") -> str:
    """Horizontal bars from zero, one per row, the note (formatted value) after each."""
    left = _label_room(r.label for r in rows)
    right = 12 + CHAR_W * max((len(r.note) for r in rows), default=0)
    x0, x1 = left, WIDTH - max(40.0, right)
    top = TOP - 8
    ticks = nice_ticks(0, max([r.value for r in rows] + [1e-9]))
    scale = lambda v: x0 + (x1 - x0) * v / ticks[-1]  # noqa: E731
    y_axis = top + ROW_H * len(rows) + 4
    body = _grid_x(ticks, scale, top - 4, y_axis)
    for i, r in enumerate(rows):
        y = top + ROW_H * i
        body.append(_text(x0 - 6, y + BAR_H - 3, r.label, anchor="end"))
        w = max(1.0, scale(r.value) - x0)
        body.append(f'<rect x="{_n(x0)}" y="{_n(y)}" width="{_n(w)}" height="{BAR_H}" '
                    f'fill="{PALETTE[0]}"><title>{escape(r.label)}: {escape(r.note)}</title></rect>')
        body.append(_text(x0 + w + 6, y + BAR_H - 3, r.note, size=11))
    body += _x_axis(x0, x1, y_axis, ticks, scale, x_label)
    return _svg(title, y_axis + BOTTOM, body, chart_id)


def _plot_area(width: float, height: float) -> tuple[float, float, float, float]:
    """(x0, x1, y0 top, y1 bottom) of an x-y plot with room for the y axis label and ticks."""
    return 64.0, width - 24.0, TOP + 10.0, height - BOTTOM


def _y_axis(x: float, y0: float, y1: float, ticks, scale, label: str) -> list[str]:
    out = [f'<line x1="{_n(x)}" y1="{_n(y0)}" x2="{_n(x)}" y2="{_n(y1)}" stroke="#444"/>']
    for t in ticks:
        y = scale(t)
        out.append(f'<line x1="{_n(x - 4)}" y1="{_n(y)}" x2="{_n(x)}" y2="{_n(y)}" stroke="#444"/>')
        out.append(_text(x - 7, y + 4, fmt_tick(t), anchor="end"))
    mid = (y0 + y1) / 2
    out.append(_text(16, mid, label, anchor="middle", extra=f' transform="rotate(-90 16 {_n(mid)})"'))
    return out


LABEL_SIZE = 11
LABEL_H = 13          # a label's line height at LABEL_SIZE


def label_box(x: float, y: float, anchor: str, text: str, size: float = LABEL_SIZE
              ) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a text label drawn at baseline (x, y), by the same glyph
    width the layout uses (CHAR_W at 12 px, scaled to `size`)."""
    w = CHAR_W * size / FONT * len(text)
    left = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
    return left, y - size * 0.8, left + w, y + size * 0.25


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(wanted, top: float, bottom: float):
    """Labels moved apart vertically so that no two boxes overlap: each label, in the order of
    its wanted height (ties by text, so the layout is deterministic), takes the nearest free
    height, trying offsets of one line up, one down, two up... within [top, bottom] where it
    can. `wanted`: (x, y, anchor, text, *rest); returns the same tuples with y moved."""
    placed: list[tuple] = []
    boxes: list[tuple[float, float, float, float]] = []
    for w in sorted(wanted, key=lambda w: (w[1], w[0], w[3])):
        x, y0, anchor, text = w[:4]
        for k in range(0, 400):
            step = (k + 1) // 2 * (1 if k % 2 == 0 else -1)   # 0, -1, +1, -2, +2 ...
            y = y0 + step * (LABEL_H + 1)
            if k < 200 and not (top <= y <= bottom):
                continue
            box = label_box(x, y, anchor, text)
            if not any(_overlap(box, b) for b in boxes):
                break
        boxes.append(box)
        placed.append((x, y, anchor, text, *w[4:]))
    return placed


def scatter(title: str, points: list[Point], x_label: str, y_label: str, height: float = 320,
            chart_id: str = "scatter", width: float = WIDTH) -> str:
    """Labelled points on axes from zero. Points at the same spot share one marker and stack
    their labels; labels of nearby points are moved apart vertically (`place_labels`), with a
    leader line to the marker when a label moved, so no label hides another."""
    x0, x1, y0, y1 = _plot_area(width, height)
    xt = nice_ticks(0, max([p.x for p in points] + [1e-9]))
    yt = nice_ticks(0, max([p.y for p in points] + [1e-9]))
    sx = lambda v: x0 + (x1 - x0) * v / xt[-1]  # noqa: E731
    sy = lambda v: y1 - (y1 - y0) * v / yt[-1]  # noqa: E731
    body = _grid_x(xt, sx, y0, y1)
    body += [f'<line x1="{_n(x0)}" y1="{_n(sy(t))}" x2="{_n(x1)}" y2="{_n(sy(t))}" stroke="#e4e4e4"/>'
             for t in yt]
    spots: dict[tuple[int, int], list[Point]] = {}
    for p in points:
        spots.setdefault((round(sx(p.x) / 6), round(sy(p.y) / 6)), []).append(p)
    wanted = []            # (x, y baseline, anchor, text, marker x, marker y)
    for i, group in enumerate(spots.values()):
        cx, cy = sx(group[0].x), sy(group[0].y)
        tip = "; ".join(f"{p.label}: {fmt_tick(round(p.x, 2))}, {fmt_tick(round(p.y, 2))}" for p in group)
        body.append(f'<circle cx="{_n(cx)}" cy="{_n(cy)}" r="5" fill="{PALETTE[i % len(PALETTE)]}" '
                    f'stroke="#222" stroke-width="0.8"><title>{escape(tip)}</title></circle>')
        anchor = "end" if cx > (x0 + x1) / 2 else "start"
        dx = -8 if anchor == "end" else 8
        for k, p in enumerate(group):
            wanted.append((cx + dx, cy - 6 - LABEL_H * k, anchor, p.label, cx, cy, cy - 6 - LABEL_H * k))
    for x, y, anchor, label, cx, cy, y_wanted in place_labels(wanted, top=y0 + LABEL_H, bottom=y1 - 2):
        if abs(y - y_wanted) > LABEL_H / 2:  # moved away from its marker: a leader line to it
            lx = x + (4 if anchor == "end" else -4)
            body.append(f'<line class="leader" x1="{_n(cx)}" y1="{_n(cy)}" x2="{_n(lx)}" '
                        f'y2="{_n(y - 4)}" stroke="#888" stroke-width="0.8"/>')
        body.append(_text(x, y, label, anchor=anchor, size=LABEL_SIZE, extra=' class="point-label"'))
    body += _x_axis(x0, x1, y1, xt, sx, x_label)
    body += _y_axis(x0, y0, y1, yt, sy, y_label)
    return _svg(title, height, body, chart_id, width)


def line_chart(title: str, series: list[Series], x_label: str, y_label: str,
               hlines: list[tuple[str, float]] = (), height: float = 280,
               chart_id: str = "lines", width: float = WIDTH) -> str:
    """Lines through each series' points, horizontal dashed reference lines (capacity) with
    their label, and each series' highlighted point drawn larger and labelled."""
    x0, x1, y0, y1 = _plot_area(width, height)
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points] + [v for _, v in hlines]
    xt = nice_ticks(0, max(xs + [1e-9]))
    yt = nice_ticks(0, max(ys + [1e-9]))
    sx = lambda v: x0 + (x1 - x0) * v / xt[-1]  # noqa: E731
    sy = lambda v: y1 - (y1 - y0) * v / yt[-1]  # noqa: E731
    body = _grid_x(xt, sx, y0, y1)
    body += [f'<line x1="{_n(x0)}" y1="{_n(sy(t))}" x2="{_n(x1)}" y2="{_n(sy(t))}" stroke="#e4e4e4"/>'
             for t in yt]
    items = [(s.name, PALETTE[i % len(PALETTE)], "box") for i, s in enumerate(series)]
    items += [(name, CAPACITY_COLOUR, "line") for name, _ in hlines]
    body += _legend(items, 8, 34)
    for name, v in hlines:
        y = sy(v)
        body.append(f'<line x1="{_n(x0)}" y1="{_n(y)}" x2="{_n(x1)}" y2="{_n(y)}" '
                    f'stroke="{CAPACITY_COLOUR}" stroke-width="2" stroke-dasharray="6 3">'
                    f'<title>{escape(name)}</title></line>')
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{_n(sx(x))},{_n(sy(y))}" for x, y in s.points)
        body.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in s.points:
            body.append(f'<circle cx="{_n(sx(x))}" cy="{_n(sy(y))}" r="3" fill="{colour}">'
                        f'<title>{escape(s.name)}: {fmt_tick(x)}, {fmt_tick(round(y, 2))}</title></circle>')
        if s.highlight is not None:
            hx, hy = sx(s.highlight[0]), sy(s.highlight[1])
            body.append(f'<circle cx="{_n(hx)}" cy="{_n(hy)}" r="6" fill="none" stroke="#222" '
                        f'stroke-width="2"/>')
            if s.highlight_label:
                body.append(_text(hx + 9, hy + 16, s.highlight_label, size=11))
    body += _x_axis(x0, x1, y1, xt, sx, x_label)
    body += _y_axis(x0, y0, y1, yt, sy, y_label)
    return _svg(title, height, body, chart_id, width)
