"""Release ranges of patch variants: which SGLang release a ``releases`` specifier set holds.

PEP 440 keeps a pre-release of 0.5.10 out of both ``<0.5.10`` and ``>=0.5.10``, so a series whose ranges meet at
0.5.10 would hold no variant for 0.5.10rc0. Two readings close that hole (docs/upstream.md, "Release ranges"):

- a pre-release or dev release of F belongs to the range that starts at ``>=F`` (:func:`starts_at_final_of`),
  unless some range holds it as written or names it in ``!=``;
- ``<F`` admits pre-releases of F in a range whose lower bound is itself a pre-release of F:
  ``>=0.5.3rc1,<0.5.3`` is 0.5.3rc1 and the pre-releases after it, up to the final 0.5.3 (:func:`in_range`).
  Read strictly it would hold nothing.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


def final_release(version: Version) -> Version:
    """The release a pre-release or dev release leads to: 0.5.10rc0 -> 0.5.10, 0.5.3.post1.dev0 -> 0.5.3.post1."""
    text = (f"{version.epoch}!" if version.epoch else "") + ".".join(map(str, version.release))
    if version.post is not None and version.pre is None:
        text += f".post{version.post}"
    return Version(text)


def _is_pre_of(version: Version, final: Version) -> bool:
    return version.is_prerelease and not final.is_prerelease and final_release(version) == final


def in_range(spec: SpecifierSet, version: Version) -> bool:
    """``version`` in ``spec`` by PEP 440 (pre-releases allowed), or by the explicit pre-release reading of
    ``<F`` above."""
    if spec.contains(version, prereleases=True):
        return True
    if not version.is_prerelease:
        return False
    final = final_release(version)
    explicit = any(s.operator in (">=", ">") and _is_pre_of(Version(s.version), final) for s in spec)
    if not explicit:
        return False
    for s in spec:
        if s.contains(version, prereleases=True):
            continue
        if s.operator == "<" and Version(s.version) == final:
            continue  # "<F" read as "below the final F": version < F holds
        return False
    return True


def starts_at_final_of(spec: SpecifierSet, version: Version) -> bool:
    """``version`` is a pre-release or dev release of F, ``spec`` starts at ``>=F``, and every other
    specifier holds ``version`` (so ``!=0.5.3rc0`` keeps 0.5.3rc0 out of ``>=0.5.3,<0.5.4,!=0.5.3rc0``)."""
    if not version.is_prerelease:
        return False
    final = final_release(version)
    if final.is_prerelease:
        return False
    starts = [s for s in spec if s.operator == ">=" and Version(s.version) == final]
    return bool(starts) and all(s.contains(version, prereleases=True) for s in spec if s not in starts)


def excluded_by_name(spec: SpecifierSet, version: Version) -> bool:
    """``spec`` names ``version`` in a ``!=`` specifier: the series leaves it out on purpose."""
    return any(s.operator == "!=" and not s.contains(version, prereleases=True) for s in spec)


def range_side(spec: SpecifierSet, version: Version) -> str:
    """Where ``version`` lies against the interval ``spec``: "inside", "before" (below its lower bound),
    "past" (above its upper bound), or "outside" (excluded otherwise, e.g. by "!=")."""
    if in_range(spec, version) or starts_at_final_of(spec, version):
        return "inside"
    for s in spec:
        if s.contains(version, prereleases=True):
            continue
        if s.operator in (">=", ">"):
            return "before"
        if s.operator in ("<", "<="):
            return "past"
        if s.operator in ("==", "~=", "==="):
            try:
                bound = Version(s.version.removesuffix(".*"))
            except InvalidVersion:
                return "outside"
            return "before" if version < bound else "past"
    return "outside"


def _parse(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def select(specs: list[SpecifierSet], version: str) -> int | None:
    """The index of the first range in ``specs`` that holds ``version`` as written, else of the first that
    starts at its final release (a pre-release or dev release), else ``None``."""
    wanted = _parse(version)
    if wanted is None:
        return None
    for test in (in_range, starts_at_final_of):
        found = next((i for i, spec in enumerate(specs) if test(spec, wanted)), None)
        if found is not None:
            return found
    return None


def hole(specs: list[SpecifierSet], version: str) -> tuple[int, int] | None:
    """(the index of the nearest range below ``version``, of the nearest above) when no range holds it, none
    names it in ``!=``, and ranges lie on both sides of it: a hole in the series. ``None`` otherwise."""
    wanted = _parse(version)
    if wanted is None or select(specs, version) is not None or any(excluded_by_name(s, wanted) for s in specs):
        return None
    sides = [range_side(spec, wanted) for spec in specs]
    below = [i for i, side in enumerate(sides) if side == "past"]
    above = [i for i, side in enumerate(sides) if side == "before"]
    if not below or not above:
        return None
    return max(below, key=lambda i: _upper(specs[i])), min(above, key=lambda i: _lower(specs[i]))


def past_all(specs: list[SpecifierSet], version: str) -> bool:
    """Whether ``version`` lies above the upper bound of every range in ``specs``."""
    return _all_on(specs, version, "past")


def before_all(specs: list[SpecifierSet], version: str) -> bool:
    """Whether ``version`` lies below the lower bound of every range in ``specs``."""
    return _all_on(specs, version, "before")


def _all_on(specs: list[SpecifierSet], version: str, side: str) -> bool:
    wanted = _parse(version)
    return wanted is not None and bool(specs) and all(range_side(spec, wanted) == side for spec in specs)


def _bound(spec: SpecifierSet, operators: tuple[str, ...], pick, default: Version) -> Version:
    found = [_parse(s.version.removesuffix(".*")) for s in spec if s.operator in operators]
    found = [v for v in found if v is not None]
    return pick(found) if found else default


def _upper(spec: SpecifierSet) -> Version:
    """Where the range ends (its tightest upper bound)."""
    return _bound(spec, ("<", "<=", "==", "~="), min, Version("0"))


def _lower(spec: SpecifierSet) -> Version:
    """Where the range starts (its tightest lower bound)."""
    return _bound(spec, (">=", ">", "==", "~="), max, Version("0"))
