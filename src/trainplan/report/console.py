"""One rich Console for reports (colour only where the terminal supports it, NO_COLOR honoured),
and `fit_table`: a table laid out for the console's width.

A terminal is often 80 columns wide, and rich squeezes a table that is wider than that by
wrapping cells into many short lines and cutting no-wrap cells with an ellipsis
("google-bert/bert-bas…"). `fit_table` never does either to an id: key columns (ids) are
no-wrap with a minimum width of their longest cell, the other columns fold, and when the table
still does not fit, the columns with the lowest priority are left out (and named under the
table). When even the key columns and the most important one do not fit, each row is written as
a small block of `header: value` lines instead (the stacked layout), which fits any width.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text


@functools.cache
def console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=None)


@dataclass(frozen=True)
class Col:
    """A column for `fit_table`: `key` columns (ids) are never cut and never left out;
    `priority`: higher stays longer (columns are left out lowest first, rightmost first)."""
    header: str
    justify: str = "left"
    key: bool = False
    priority: int = 0


def cell_len(markup: str) -> int:
    """Printed width of a cell written in rich markup."""
    return Text.from_markup(markup).cell_len


def _need(col: Col, cells: list[str]) -> int:
    """Width a column needs so that no cell wraps (the header may wrap at its spaces)."""
    words = max((len(w) for w in col.header.split()), default=1)
    return max([words] + [cell_len(c) for c in cells])


def _table_width(needs: list[int]) -> int:
    """Width of a Table(show_edge=False, pad_edge=False): padding 1 either side of each column
    except the outer edges, one separator between columns."""
    n = len(needs)
    return sum(needs) + 2 * n - 2 + (n - 1)


def fit_table(cols: list[Col], rows: list[list[str]], width: int, title: str = "",
              **table_kw) -> Group | Table:
    """`rows` (cells in rich markup) under `cols`, laid out to fit `width` columns."""
    needs = [_need(c, [r[i] for r in rows]) for i, c in enumerate(cols)]
    keep = list(range(len(cols)))
    # leave out the lowest-priority non-key columns until the table fits
    order = sorted((i for i, c in enumerate(cols) if not c.key),
                   key=lambda i: (cols[i].priority, -i))
    dropped: list[int] = []
    while _table_width([needs[i] for i in keep]) > width and order:
        if len([i for i in keep if not cols[i].key]) <= 1:
            break
        i = order.pop(0)
        keep.remove(i)
        dropped.append(i)
    if _table_width([needs[i] for i in keep]) > width:
        return stacked(cols, rows, title)
    for i in sorted(dropped, key=lambda i: (-cols[i].priority, i)):   # put back what fits now
        trial = sorted(keep + [i])
        if _table_width([needs[j] for j in trial]) <= width:
            keep = trial
            dropped.remove(i)
    needs = list(needs)
    for i in keep:               # room left: headers on one line, left to right
        extra = len(cols[i].header) - needs[i]
        if extra > 0 and _table_width([needs[j] for j in keep]) + extra <= width:
            needs[i] += extra
    t = Table(title=title or None, title_justify="left", show_edge=False, pad_edge=False,
              header_style="bold", **table_kw)
    for i in keep:
        c = cols[i]
        t.add_column(c.header, justify=c.justify, width=needs[i], no_wrap=c.key,
                     overflow="fold")
    for r in rows:
        t.add_row(*(r[i] for i in keep))
    if not dropped:
        return t
    left_out = ", ".join(cols[i].header for i in sorted(dropped))
    return Group(t, f"[dim]{escape('(left out at this width: ' + left_out + '; a wider terminal or --format md shows them)')}[/dim]")


def stacked(cols: list[Col], rows: list[list[str]], title: str = "") -> Group:
    """Each row as its key cells on one line and `header: value` lines below (any width)."""
    lines: list[str] = [f"[bold]{escape(title)}[/bold]"] if title else []
    for r in rows:
        keys = [r[i] for i, c in enumerate(cols) if c.key]
        lines.append("[bold]" + "  ".join(keys) + "[/bold]" if keys else "")
        lines += [f"  {escape(c.header)}: {r[i]}" for i, c in enumerate(cols)
                  if not c.key and Text.from_markup(r[i]).plain not in ("", "-")]
    return Group(*lines)
