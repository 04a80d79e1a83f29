"""The words the patch manager reports, each written once.

Each member's value is the exact string of the JSON documents, the tables and the CLI contract; the
members are ``str`` too, so they compare equal to that string, and ``str()``, ``format()``, f-strings and
``json.dumps`` give the plain value on every Python this package supports (``str``-mixin enums format
differently between 3.10, 3.11 and 3.12, hence the two methods below).

- :class:`PatchStatus`: what planning a series says of each patch (``apply --dry-run``, ``check-upstream``).
- :class:`HunkStatus`: what placing one hunk gives.
- :class:`TreeStatus`: what ``status`` says of each patch on a tree; ``apply`` reports
  :attr:`TreeStatus.APPLIED` for a patch it wrote and a :class:`PatchStatus` for the others.
"""

from __future__ import annotations

import enum

__all__ = ["HunkStatus", "PatchStatus", "TreeStatus", "Word", "tree_status"]


class Word(str, enum.Enum):
    """A ``str`` enum whose ``str()`` and ``format()`` are its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class PatchStatus(Word):
    APPLIES = "applies"
    ALREADY_APPLIED = "already-applied"
    PRESENT_UPSTREAM = "present-upstream"
    NOT_APPLICABLE = "not-applicable"
    CONFLICT = "conflict"


class HunkStatus(Word):
    APPLIES = "applies"
    ALREADY_APPLIED = "already-applied"
    CONFLICT = "conflict"


class TreeStatus(Word):
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    PRESENT_UPSTREAM = "present-upstream"
    NOT_APPLICABLE = "not-applicable"
    CONFLICT = "conflict"
    FILE_MISSING = "file-missing"


_FOUND = {
    PatchStatus.APPLIES: TreeStatus.NOT_APPLIED,
    PatchStatus.ALREADY_APPLIED: TreeStatus.APPLIED,
    PatchStatus.PRESENT_UPSTREAM: TreeStatus.PRESENT_UPSTREAM,
    PatchStatus.NOT_APPLICABLE: TreeStatus.NOT_APPLICABLE,
    PatchStatus.CONFLICT: TreeStatus.CONFLICT,
}


def tree_status(status: PatchStatus) -> TreeStatus:
    """What ``status`` reports for a patch that planning gave ``status`` (before the state record's say)."""
    return _FOUND[PatchStatus(status)]
