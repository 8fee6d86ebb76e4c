"""Where trainplan keeps files: measurements and calibrations in its home, caches apart.

$TRAINPLAN_HOME holds both (caches under `cache/`); without it they follow the XDG base
directories: ~/.local/share/trainplan for data, ~/.cache/trainplan for caches.
"""
from __future__ import annotations

import os
from pathlib import Path


def trainplan_home() -> Path:
    """Measurements and calibrations: $TRAINPLAN_HOME, else ~/.local/share/trainplan."""
    return Path(os.environ.get("TRAINPLAN_HOME") or "~/.local/share/trainplan").expanduser()


def cache_dir() -> Path:
    """Caches that can be rebuilt: $TRAINPLAN_HOME/cache if set, else $XDG_CACHE_HOME/trainplan
    (default ~/.cache/trainplan)."""
    if os.environ.get("TRAINPLAN_HOME"):
        return trainplan_home() / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "trainplan"
