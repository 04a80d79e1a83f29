"""The folders of this repository the tests read, found once from this file's place (tests/support/).

Tests, helpers and the probes run as scripts import these names instead of counting parents of their own
``__file__``, so a test file can move between the folders of tests/ without a path changing."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = REPO_ROOT / "tests"
DATA_DIR = TESTS_DIR / "data"  # fixtures read by path: series, nvidia-smi output, stand-in packages
PACKAGES_DIR = TESTS_DIR / "packages"  # small projects the build tests compile
SUPPORT_DIR = TESTS_DIR / "support"  # this folder: helpers, and the probes run as scripts by path
SCRIPTS_DIR = REPO_ROOT / "scripts"
