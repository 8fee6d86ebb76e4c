"""A finding: something a user should know about a job on a target, with the fix.

`kind` says what it is about, so code never tells findings apart by their text:

    memory         the step does not fit the device (a micro-batch or the fix ladder can cure it)
    compatibility  the target cannot run part of the job as written (compat.py)
    advice         runs, but slower or riskier than it needs to be
    strategy       what a multi-device strategy does (expert parallelism without experts)
"""
from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("error", "warning", "info")
KINDS = ("memory", "compatibility", "advice", "strategy")


@dataclass(frozen=True)
class Finding:
    severity: str      # error | warning | info
    message: str
    fix: str | None = None
    kind: str = "advice"

    def __post_init__(self):
        assert self.severity in SEVERITIES and self.kind in KINDS, (self.severity, self.kind)

    @property
    def blocks(self) -> bool:
        """An error no micro-batch can cure (not memory): the job cannot run as written here."""
        return self.severity == "error" and self.kind != "memory"

    def to_dict(self) -> dict:
        return {"severity": self.severity, "kind": self.kind, "message": self.message,
                "fix": self.fix}
