"""A value known by its canonical name: precision.py and strategy.py define their constants on it.

It prints as its name, equals itself and its name (`job.precision == "bf16-amp"`), and hashes
by its name, so JSON, reports and cache keys see the word users wrote in its canonical spelling.
"""
from __future__ import annotations


class Named:
    name: str

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            return other == self.name
        return isinstance(other, type(self)) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)
