"""What a config reader found: every field read and what it became in trainplan's job, every field
that changes memory or time but is not modelled, the defaults the framework applies that the
file leaves out, the keys the framework knows that change neither, and the keys nobody knows.

A reader walks the file with a `Collector`: `take(key)` marks a key as used and returns its
value; `read(key, value, meaning, **job)` records a field and the job settings it gives;
`unmodelled(key, value, why)` names a field that matters but is not planned; `assume(text)`
states a default the framework fills in. `finish()` sorts what is left: a key in the
framework's schema (data/config_keys/<kind>.json, scripts/config_keys.py) with no effect on memory
or time is `ignored`; any other is `unknown`. Nothing is dropped in silence.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from ..errors import TrainplanError

WIDTH = 80


def show(value: Any) -> str:
    """A value as the file's author wrote it: true/false/null, lists in brackets, no Python
    reprs."""
    if isinstance(value, str):
        return value if value.strip() == value and value else json.dumps(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float) and abs(value) >= 1e6:
        return f"{value:.6g}".replace("e+0", "e").replace("e+", "e")     # 5e8, as written
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return str(value)


@dataclass(frozen=True)
class Field:
    key: str              # as written in the file; nested keys dotted: trl.num_generations
    value: Any            # as written
    meaning: str          # what trainplan plans with: "micro-batch 2"


@dataclass
class Reading:
    """A framework config, read: the job settings it gives and what was made of every key."""

    kind: str                                   # axolotl | llama-factory | trl | torchtune | ...
    path: str
    settings: dict = field(default_factory=dict)   # Job fields
    read: list[Field] = field(default_factory=list)
    unmodelled: list[Field] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    companions: list["Reading"] = field(default_factory=list)   # DeepSpeed / accelerate files
    data: dict = field(default_factory=dict, repr=False)        # the file as loaded

    @property
    def label(self) -> str:
        return LABELS.get(self.kind, self.kind)

    def all(self) -> list["Reading"]:
        return [self] + [r for c in self.companions for r in c.all()]

    def lines(self, width: int = WIDTH) -> list[str]:
        """What was read, for people: one block per file (this one, then its companions)."""
        out: list[str] = []
        for r in self.all():
            out += r._block(width)
        return out

    def _block(self, width: int) -> list[str]:
        if self.kind == "trainplan":          # a trainplan job: only what came beside it
            return []
        out = _wrap(f"read from {self.label} ({self.path}):", width, "", "  ")
        for f in self.read:
            out += _wrap(f"{f.key} {show(f.value)} -> {f.meaning}", width, "  ", "      ")
        if self.unmodelled:
            out.append("  not modelled (changes memory or time; planned without it):")
            for f in self.unmodelled:
                out += _wrap(f"{f.key} {show(f.value)}: {f.meaning}", width, "    ", "      ")
        if self.assumed:
            out.append(f"  {self.label}'s defaults for what the file leaves out:")
            for a in self.assumed:
                out += _wrap(a, width, "    ", "      ")
        if self.unknown:
            out += _wrap(f"unknown keys (not {self.label}'s, nor trainplan's; ignored): "
                         + ", ".join(self.unknown), width, "  ", "    ")
        if self.ignored:
            out += _wrap(f"no effect on memory or time as set ({len(self.ignored)}): "
                         + ", ".join(self.ignored), width, "  ", "    ")
        return out

    def note(self) -> str:
        """One line for the plan's notes: where the job came from and what it leaves out."""
        name = lambda r: Path(r.path).name      # the full paths head the output (lines())
        parts = [f"job read from the {self.label} config {name(self)}"
                 + "".join(f" with the {c.label} config {name(c)}" for c in self.all()[1:])]
        unmodelled = [f.key for r in self.all() for f in r.unmodelled]
        unknown = [k for r in self.all() for k in r.unknown]
        if unmodelled:
            parts.append("not modelled: " + ", ".join(unmodelled))
        if unknown:
            parts.append("unknown keys: " + ", ".join(unknown))
        return "; ".join(parts)

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path,
                "read": [{"key": f.key, "value": f.value, "meaning": f.meaning}
                         for f in self.read],
                "not_modelled": [{"key": f.key, "value": f.value, "why": f.meaning}
                                 for f in self.unmodelled],
                "assumed": list(self.assumed), "unknown": list(self.unknown),
                "ignored": list(self.ignored),
                "companions": [c.to_json() for c in self.companions]}


LABELS = {"axolotl": "axolotl", "llama-factory": "LLaMA-Factory", "trl": "TRL",
          "torchtune": "torchtune", "deepspeed": "DeepSpeed", "accelerate": "accelerate",
          "hf-trainer": "TrainingArguments", "trainplan": "trainplan"}


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=True) or [first.rstrip()]


class Collector:
    """Walks one config's keys; see the module docstring."""

    def __init__(self, kind: str, path: str, data: dict, known: set[str] | None = None,
                 prefix: str = "", reading: Reading | None = None):
        self.reading = reading or Reading(kind, path, data=data)
        self.data = data
        self.known = known if known is not None else set(data)
        self.prefix = prefix
        self.used: set[str] = set()
        self.children: list[Collector] = []

    def section(self, key: str, known: set[str] | None = None) -> "Collector":
        """The nested mapping under `key` (empty if absent), walked with the same reading: its
        keys are shown dotted (`trl.beta`)."""
        value = self.take(key)
        if value is not None and not isinstance(value, dict):
            raise self.error(key, f"must be a mapping of settings, got {show(value)}.")
        child = Collector(self.reading.kind, self.reading.path, value or {}, known,
                          self.prefix + key + ".", self.reading)
        self.children.append(child)
        return child

    # --- reading keys ---------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def take(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        v = self.data.get(key)
        return default if v is None else v

    def read(self, key: str, value: Any, meaning: str, **settings) -> None:
        self.used.add(key)
        self.reading.read.append(Field(self.prefix + key, value, meaning))
        self.reading.settings.update(settings)

    def set(self, **settings) -> None:
        self.reading.settings.update(settings)

    def unmodelled(self, key: str, value: Any, why: str) -> None:
        self.used.add(key)
        self.reading.unmodelled.append(Field(self.prefix + key, value, why))

    def assume(self, text: str) -> None:
        self.reading.assumed.append(text)

    def error(self, key: str, what: str, allowed: str | None = None,
              fix: str | None = None) -> TrainplanError:
        return TrainplanError(f"{self.reading.label} config {self.reading.path}: "
                              f"{self.prefix}{key}: {what}",
                              allowed=allowed, fix=fix)

    # --- checking a few shapes --------------------------------------------------------------
    def int_(self, key: str, value: Any, at_least: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < at_least:
            raise self.error(key, f"must be a whole number >= {at_least}, got {show(value)}.",
                             fix=f"write it like `{key.split('.')[-1]}: {max(at_least, 1)}`")
        return value

    def number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, got {show(value)}.")
        return float(value)

    # --- the rest -------------------------------------------------------------------------
    def unmodelled_table(self, table: dict[str, tuple[Any, str]]) -> None:
        """Keys that change memory or time when set away from their default (key -> (default,
        why)); named when the file sets them so."""
        for key, (default, why) in table.items():
            if key in self.used or key not in self.data:
                continue
            v = self.data[key]
            if v is None or v == default or (default is False and not v):
                self.used.add(key)
                continue
            self.unmodelled(key, v, why)

    def finish(self) -> Reading:
        """Sort the keys no line names: known (or looked at) -> ignored, else unknown."""
        r = self.reading
        shown = {f.key for f in r.read + r.unmodelled}
        for child in self.children:
            child.finish()
        nested = {c.prefix[len(self.prefix):-1] for c in self.children}
        for key in self.data:
            name = self.prefix + str(key)
            if name in shown or key in nested:
                continue
            if key in self.known or key in self.used:
                if self.data[key] is not None:       # `key:` left empty sets nothing
                    r.ignored.append(name)
            else:
                r.unknown.append(name)
        if not self.prefix:
            r.ignored.sort()
        return r
