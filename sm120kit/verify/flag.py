"""A finding of the environment report: its severity, the component it is about, what is wrong and the fix.

Its own module so that the parts of the report that make findings (``topology`` for several GPUs) and the
report itself both import it, and not each other."""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Flag:
    severity: str  # "error" | "warning" | "info"
    component: str
    message: str
    fix: str = ""
