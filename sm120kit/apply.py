"""Applying, reverting and reporting a patch series on an SGLang tree (planning lives in :mod:`sm120kit.plan`)."""

from __future__ import annotations

from sm120kit.hunks import HunkResult
from sm120kit.plan import FileChange, PatchPlan, SeriesPlan, plan_series

__all__ = ["FileChange", "HunkResult", "PatchPlan", "SeriesPlan", "plan_series"]
