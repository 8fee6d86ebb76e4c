"""One error type for bad input: what is wrong, what is allowed, what to try.

The CLI turns a `TrainplanError` into one message on stderr and exit code 2
(never a traceback). A job that does not fit is a *result*, not an error.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


class TrainplanError(Exception):
    """Bad input. `str(err)` is the full, user-facing message."""

    def __init__(self, what: str, *, allowed: str | None = None, fix: str | None = None):
        self.what = what
        self.allowed = allowed
        self.fix = fix
        parts = [what]
        if allowed:
            parts.append(f"Allowed: {allowed}")
        if fix:
            parts.append(f"To fix: {fix}")
        super().__init__("\n".join(parts))


def close_matches(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Choices that look like `name` (case-insensitive), best first."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    key = name.lower()
    hits = difflib.get_close_matches(key, list(lowered), n=n, cutoff=0.5)
    # substring hits help for ids like "llama-2-7b" vs "meta-llama/Llama-2-7b-hf"
    for c in choices:
        if len(hits) >= n:
            break
        if key and key in c.lower() and c.lower() not in hits:
            hits.append(c.lower())
    return [lowered[h] for h in hits]


def unknown(kind: str, name: str, choices: Iterable[str], hint: str | None = None,
            note: Callable[[str], str] | None = None) -> TrainplanError:
    """`unknown("GPU", "t5", catalog_ids)` -> error naming close matches; `note(choice)` adds
    a word after a match (a retired platform: "(retired 2026-09-15)")."""
    choices = sorted(set(choices))
    matches = close_matches(name, choices)
    what = f"Unknown {kind} {name!r}."
    if matches:
        what += " Did you mean " + ", ".join(repr(m) + (note(m) if note else "")
                                             for m in matches) + "?"
    shown = ", ".join(choices[:40]) + (" ..." if len(choices) > 40 else "")
    return TrainplanError(what, allowed=shown, fix=hint)
