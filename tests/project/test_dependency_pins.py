"""pyproject.toml gives ranges (the dependencies and the extras); constraints/ci.txt pins the exact versions the
tests run with, so that a new release of a dependency cannot change what CI runs."""

from __future__ import annotations

import sys

from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONSTRAINTS = REPO_ROOT / "constraints" / "ci.txt"
EXTRAS_PINNED = ("dependencies", "audit", "build", "test")


def _extras() -> dict[str, list[Requirement]]:
    """The extras by name, and the project's own dependencies under ``dependencies``."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    groups["dependencies"] = [Requirement(r) for r in project["dependencies"]]
    return groups


def _pins(text: str) -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in pins, f"{CONSTRAINTS.name}:{number}: {req.name} is pinned twice"
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", (
            f"{CONSTRAINTS.name}:{number}: {line!r} is not an exact pin"
        )
        pins[name] = req
    return pins


def _pin_problems(extras: dict[str, list[Requirement]], pins: dict[str, Requirement]) -> list[str]:
    problems = []
    used = set()
    for extra in EXTRAS_PINNED:
        for req in extras[extra]:
            name = canonicalize_name(req.name)
            used.add(name)
            pin = pins.get(name)
            if pin is None:
                problems.append(f"[{extra}] {req} has no pin in {CONSTRAINTS.name}")
                continue
            if any(s.operator in ("==", "===") for s in req.specifier):
                problems.append(f"[{extra}] {req} is an exact pin; give a range and pin it in {CONSTRAINTS.name}")
            version = next(iter(pin.specifier)).version
            if not req.specifier.contains(version, prereleases=True):
                problems.append(f"[{extra}] {req}: the pin {pin} is outside the range")
            if str(req.marker or "") != str(pin.marker or ""):
                problems.append(f"[{extra}] {req}: the pin {pin} has another environment marker")
    problems += [f"{pins[n]} pins no package of an extra" for n in sorted(set(pins) - used)]
    return problems


def test_every_extra_package_has_a_pin_inside_its_range():
    assert _pin_problems(_extras(), _pins(CONSTRAINTS.read_text(encoding="utf-8"))) == []


def test_pin_check_reports_each_kind_of_mismatch():
    extras = {
        "dependencies": [Requirement("tomlkit>=0.12")],
        "audit": [
            Requirement("torch>=2.11"),
            Requirement("numpy==2.4.6"),
            Requirement("tomli>=2.0.1; python_version < '3.11'"),
        ],
        "build": [Requirement("cmake>=3.31")],
        "test": [Requirement("pytest>=8")],
    }
    pins = _pins("torch==2.10.0\nnumpy==2.4.6\ntomli==2.2.1\npytest==9.2.0  # the runner\nnotused==1.0\n")
    assert _pin_problems(extras, pins) == [
        f"[dependencies] tomlkit>=0.12 has no pin in {CONSTRAINTS.name}",
        "[audit] torch>=2.11: the pin torch==2.10.0 is outside the range",
        f"[audit] numpy==2.4.6 is an exact pin; give a range and pin it in {CONSTRAINTS.name}",
        '[audit] tomli>=2.0.1; python_version < "3.11": the pin tomli==2.2.1 has another environment marker',
        f"[build] cmake>=3.31 has no pin in {CONSTRAINTS.name}",
        "notused==1.0 pins no package of an extra",
    ]


def test_test_script_installs_the_extras_with_the_constraints():
    script = (REPO_ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    install = [line for line in script.splitlines() if "pip install" in line and "-e" in line]
    assert len(install) == 1 and "-c constraints/ci.txt" in install[0], install
