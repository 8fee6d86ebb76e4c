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


def suggestion(name: str, choices: Iterable[str], n: int = 3,
               show: Callable[[str], str] = repr, matches: list[str] | None = None) -> str:
    """The phrase ` Did you mean 'a', 'b'?` naming up to `n` of the choices that look like
    `name` (`matches`: found by the caller's own measure), each printed by `show`; empty when
    none does."""
    found = (close_matches(name, choices) if matches is None else matches)[:n]
    return " Did you mean " + ", ".join(map(show, found)) + "?" if found else ""


def unknown(kind: str, name: str, choices: Iterable[str], hint: str | None = None,
            note: Callable[[str], str] | None = None, *, what: str | None = None, n: int = 3,
            show: Callable[[str], str] = repr, allowed: str | None = None) -> TrainplanError:
    """The error for a name that is not one of `choices`, naming close matches: the one way
    every unknown name is reported. `unknown("GPU", "t5", catalog_ids)` -> "Unknown GPU 't5'.
    Did you mean 't4'?", the choices as what is allowed (the first 40) and `hint` as the fix.

    `what`: the sentence instead of "Unknown <kind> <name>." (where the value came from: "--strategy
    'zer3' is not a strategy."); `n`: how many matches to name; `show`: how each is printed
    (`note(choice)`, if given, adds a word after it: a retired platform's "(retired
    2026-09-15)"); `allowed`: the allowed values as the caller lists them."""
    pool = list(dict.fromkeys(choices))
    shown = sorted(pool)
    if note is not None:
        show = (lambda m, base=show: base(m) + note(m))
    text = (what if what is not None else f"Unknown {kind} {name!r}.")
    text += suggestion(name, shown if what is None else pool, n, show)
    if allowed is None:
        allowed = ", ".join(shown[:40]) + (" ..." if len(shown) > 40 else "")
    return TrainplanError(text, allowed=allowed, fix=hint)
