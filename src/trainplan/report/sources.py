"""The entries of data/SOURCES.md by id (S25, K1...), for the reports' sources table: read, not
computed. An entry is a bullet `- **S25** text...` with its indented continuation lines."""
from __future__ import annotations

import functools
import re
from importlib import resources

ENTRY = re.compile(r"^- \*\*([A-Z]+\d+)\*\*\s*(.*)$")


@functools.cache
def source_entries() -> dict[str, str]:
    """id -> the entry's text (one line, whitespace collapsed); {} if the file is missing."""
    try:
        text = (resources.files("trainplan") / "data" / "SOURCES.md").read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return {}
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            current = m.group(1)
            out[current] = [m.group(2)]
        elif current and line.startswith("  ") and line.strip():
            out[current].append(line.strip())
        else:
            current = None
    return {k: " ".join(v) for k, v in out.items()}


def anchor(source_id: str) -> str:
    """The HTML id of a source's row in the sources table."""
    return f"src-{source_id}"
