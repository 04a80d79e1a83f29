"""The package layers of docs/design.md hold: the import-linter contracts in pyproject.toml are all kept.

The linter reads the imports of this checkout's sm120kit (not an installed copy) and fails on a lower layer
importing a higher one, on feature packages importing each other, and on anything outside sm120kit.cli
importing sm120kit.ui.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

REPO = REPO_ROOT

pytest.importorskip("importlinter", reason="import-linter is in the test extra: pip install -e '.[test]'")


def test_import_contracts_are_kept() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout and "BROKEN" not in proc.stdout


def test_contracts_cover_every_package() -> None:
    """Each subpackage of sm120kit is named by the layers contract, so a new package cannot sit outside it."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c for c in config["contracts"] if c["type"] == "layers"]
    named = {name.strip() for layer in layers["layers"] for name in layer.replace(":", "|").split("|")}
    packages = {f"sm120kit.{p.name}" for p in (REPO / "sm120kit").iterdir() if (p / "__init__.py").is_file()}
    packages |= {"sm120kit.errors", "sm120kit.runner"}
    assert packages <= named, f"not in the layers contract: {sorted(packages - named)}"


# Class names that may appear more than once in sm120kit, each with the reason. Empty: every class name
# says what the class is, so two different things never read alike in code, tracebacks and docs.
SHARED_CLASS_NAMES: dict[str, str] = {}


def test_no_two_classes_share_a_name() -> None:
    import ast
    from collections import defaultdict

    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted((REPO / "sm120kit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert where, "no classes found: the walk read nothing"
    shared = {name: places for name, places in where.items() if len(places) > 1 and name not in SHARED_CLASS_NAMES}
    assert not shared, f"classes that share a name (rename one, or list it in SHARED_CLASS_NAMES): {shared}"


def test_scripts_and_tests_do_not_put_repository_folders_on_sys_path() -> None:
    """Scripts and tests import sm120kit, the kernels and the test helpers as installed packages and through
    pytest's pythonpath; a ``sys.path.insert`` may only put an SGLang tree (a probe's argument) on the path."""
    import re

    call = re.compile(r"sys\.path\.insert\(\s*0\s*,\s*([^\n)]{1,200})\)")
    own = re.compile(r"__file__|REPO|TESTS_DIR|SCRIPTS_DIR|SUPPORT_DIR|kernels|\.parent")
    offenders = []
    for folder in ("scripts", "tests"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for lineno, line in enumerate(path.read_text().splitlines(), 1):
                found = call.search(line)
                if found and own.search(found.group(1)):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "repository folders put on sys.path by hand:\n" + "\n".join(offenders)
