"""Where trainplan keeps files: measurements and calibrations in its home, caches apart.

$TRAINPLAN_HOME holds both (caches under `cache/`); without it they follow the XDG base
directories: ~/.local/share/trainplan for data, ~/.cache/trainplan for caches.
"""
from __future__ import annotations

import os
import tempfile
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


def atomic_write(path: str | Path, text: str | bytes, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` all at once: into a temporary file in the same folder, then
    `os.replace` onto `path`. A failure (a render error, a full disk, Ctrl-C) leaves the old file
    as it was and no partial file behind. An existing file's permission bits are kept."""
    path = Path(path)
    data = text.encode(encoding) if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        except FileNotFoundError:    # a new file: the usual mode, not mkstemp's 0600
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
