"""Where a plan goes: the terminal (rich), stdout in another format, and/or a report file.

    --format text|md|json|html     what is printed on stdout (text: the rich terminal report)
    --report FILE                  also write FILE; its format from the extension (.md, .html, .json)

Markdown, HTML and JSON render one document (`plan_document.document`): the plan's JSON plus
the memory-against-micro-batch curves and the catalog rows (computed by plan/extras.py; the
curves cost a trace or two per kernel semantics, so the CLI asks for them only when one of those
formats is wanted: `needs_curves`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import TrainplanError
from ..paths import atomic_write
from ..plan.extras import ReportExtras
from .plan_document import document

FORMATS = ("text", "md", "json", "html")
EXTENSIONS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json"}


def report_format(path: str | None) -> str | None:
    """The format of a --report file, from its extension; None when there is no file."""
    if path is None:
        return None
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise TrainplanError(f"--report {path}: cannot tell the format from {ext or 'no extension'!r}.",
                             allowed=", ".join(EXTENSIONS),
                             fix="name the file plan.md, plan.html or plan.json")
    return EXTENSIONS[ext]


def check_report(path: str | None, force: bool = False) -> None:
    """Before any tracing: the --report path is a file that may be written. An existing file is
    a user's (an earlier report, or notes that happen to share the name) and is replaced only
    with --force, as `export` replaces files; a folder is not a file."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise TrainplanError(f"--report {path} is a folder.",
                             fix=f"name a file in it: {p / 'plan.md'}")
    report_format(path)
    if p.exists() and not force:
        raise TrainplanError(f"--report {path} exists; a plan does not replace a file without "
                             "--force.", fix="add --force to replace it, or name another file")


def needs_curves(fmt: str, report: str | None) -> bool:
    return fmt in ("md", "json", "html") or report_format(report) is not None


def render(plan, extras: ReportExtras, fmt: str) -> str:
    """The plan as md, json or html text."""
    doc = document(plan, extras)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "md":
        from .plan_markdown import plan_markdown
        return plan_markdown(plan, doc=doc)
    if fmt == "html":
        from .plan_html import plan_html
        return plan_html(plan, doc=doc)
    raise TrainplanError(f"--format {fmt!r} is not a choice.", allowed=", ".join(FORMATS))


def emit_plan(plan, extras: ReportExtras, fmt: str = "text", report: str | None = None) -> None:
    """Print the plan in `fmt` and write the --report file, if any."""
    rfmt = report_format(report)
    if fmt == "text":
        from .plan_rich import plan_rich
        plan_rich(plan, extras)
    else:
        sys.stdout.write(render(plan, extras, fmt))
    if rfmt is not None:
        try:
            atomic_write(report, render(plan, extras, rfmt))
        except OSError as e:
            raise TrainplanError(f"cannot write --report {report}: {e.strerror}.",
                                 fix="give a path in a directory you can write to") from e
        print(f"trainplan: wrote {report} ({rfmt})", file=sys.stderr)
