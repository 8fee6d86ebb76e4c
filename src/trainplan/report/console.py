"""One rich Console for reports: colour only where the terminal supports it (NO_COLOR honoured)."""
from __future__ import annotations

import functools

from rich.console import Console


@functools.cache
def console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=None)
