"""Find the sgl-kernel source to build and describe it.

``SRC`` may be an SGLang git clone, where the kernel source is ``sgl-kernel/`` (up to 0.5.16) or
``python/sglang/kernels/aot/`` (from 0.5.17), or the kernel folder itself (any scikit-build-core project
with a ``CMakeLists.txt``). The result names the folder, the kernel's own version (``[project] version``
of its pyproject), the SGLang release of the clone, the git commit, the CMake options the source offers
and whether its build needs torch.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from sm120kit import runner
from sm120kit.errors import UsageError
from sm120kit.sglang.gitrepo import release_of_commit
from sm120kit.sglang.metadata import read_stated_version, version_in_file

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # pragma: no cover - Python 3.10
    _toml = None

# Where the kernel source lies inside an SGLang clone, newest layout first.
CLONE_LAYOUTS = (
    ("python/sglang/kernels/aot", "kernels/aot"),  # SGLang 0.5.17 and later
    ("sgl-kernel", "sgl-kernel"),  # SGLang up to 0.5.16
)

_OPTION_RE = re.compile(r"^\s*option\s*\(\s*([A-Za-z0-9_]+)", re.M)
_MIN_CMAKE_RE = re.compile(r"cmake_minimum_required\s*\(\s*VERSION\s+([0-9.]+)", re.I)


@dataclass(frozen=True)
class KernelSource:
    path: Path  # the kernel folder: holds CMakeLists.txt and pyproject.toml
    layout: str  # "kernels/aot" | "sgl-kernel" | "folder"
    name: str | None  # [project] name: "sgl-kernel" / "sglang-kernel"
    version: str | None  # [project] version of the kernel
    sglang_version: str | None = None  # release of the surrounding SGLang clone
    repo_root: Path | None = None
    commit: str | None = None
    build_requires: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # option() names declared in CMakeLists.txt and cmake/*.cmake
    cmake_minimum: str | None = None
    fingerprint: str = ""  # hash of the build description files (CMake files + pyproject)
    cmake_files: tuple[Path, ...] = field(default=())

    @property
    def requires_torch(self) -> bool:
        return any(re.match(r"^\s*torch\b", r) for r in self.build_requires)

    @property
    def is_sgl_kernel(self) -> bool:
        return self.layout != "folder" or (self.name or "") in ("sgl-kernel", "sglang-kernel")

    @property
    def label(self) -> str:
        what = f"{self.name or 'kernel'} {self.version or '(unknown version)'}"
        if self.sglang_version:
            what += f", SGLang {self.sglang_version}"
        if self.commit:
            what += f" @ {self.commit[:12]}"
        return f"{self.path} ({what})"

    def has_option(self, name: str) -> bool:
        return name in self.options

    def to_json(self) -> dict:
        return {
            "path": str(self.path),
            "layout": self.layout,
            "name": self.name,
            "version": self.version,
            "sglang_version": self.sglang_version,
            "repo_root": str(self.repo_root) if self.repo_root else None,
            "commit": self.commit,
            "requires_torch": self.requires_torch,
            "options": list(self.options),
            "cmake_minimum": self.cmake_minimum,
        }


def _is_kernel_folder(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "pyproject.toml").is_file()


def cmake_files(kernel_dir: Path) -> tuple[Path, ...]:
    """``CMakeLists.txt`` and the ``cmake/*.cmake`` files beside it (where FetchContent and options live)."""
    files = [kernel_dir / "CMakeLists.txt"]
    cmake_dir = kernel_dir / "cmake"
    if cmake_dir.is_dir():
        files += sorted(p for p in cmake_dir.rglob("*.cmake") if p.is_file())
    return tuple(files)


def read_pyproject(path: Path) -> dict:
    text = path.read_text(encoding="utf-8", errors="replace")
    if _toml is not None:
        try:
            return _toml.loads(text)
        except Exception as exc:  # tomllib.TOMLDecodeError
            raise UsageError(f"{path} is not valid TOML: {exc}.") from exc
    # Python 3.10 without tomllib: the three fields used here, read line by line.
    data: dict = {"project": {}, "build-system": {}}
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    requires = re.search(r"^requires\s*=\s*\[(.*?)\]", text, re.M | re.S)
    if name:
        data["project"]["name"] = name.group(1)
    if version:
        data["project"]["version"] = version.group(1)
    if requires:
        data["build-system"]["requires"] = re.findall(r'"([^"]+)"', requires.group(1))
    return data


def _git(root: Path, *args: str) -> str | None:
    try:
        result = runner.run(["git", "-C", str(root), *args], check=False, what="git")
    except Exception:  # git missing: a plain folder then
        return None
    return result.stdout.strip() if result.ok and result.stdout.strip() else None


def _sglang_version(repo_root: Path) -> str | None:
    """The release the clone's ``python/sglang`` states, else the nearest release tag before HEAD."""
    stated, _ = read_stated_version(repo_root / "python" / "sglang")
    return stated or release_of_commit(repo_root, "HEAD").release


def find_kernel_source(src: str | Path | None = None) -> KernelSource:
    """Resolve ``src`` (default: the current folder) to the kernel source to build."""
    given = Path(src if src is not None else ".").expanduser()
    if not given.exists():
        raise UsageError(
            f"The kernel source {given} does not exist.",
            hint="Pass an SGLang git clone or the sgl-kernel source folder.",
        )
    given = given.resolve()
    layout = "folder"
    kernel_dir: Path | None = None
    repo_root: Path | None = None
    for rel, name in CLONE_LAYOUTS:
        if _is_kernel_folder(given / rel):
            kernel_dir, layout, repo_root = given / rel, name, given
            break
    if kernel_dir is None:
        if _is_kernel_folder(given):
            kernel_dir = given
            # the kernel folder of a clone: recognise the layout from the path
            parts = given.as_posix()
            if parts.endswith("/python/sglang/kernels/aot"):
                layout, repo_root = "kernels/aot", given.parents[3]
            elif given.name == "sgl-kernel" and (given.parent / "python").is_dir():
                layout, repo_root = "sgl-kernel", given.parent
        else:
            raise UsageError(
                f"{given} holds no kernel source: looked for CMakeLists.txt and pyproject.toml in "
                f"{given}/python/sglang/kernels/aot (SGLang 0.5.17 and later), {given}/sgl-kernel (up to "
                f"0.5.16) and {given} itself.",
                hint="Pass an SGLang git clone (git clone https://github.com/sgl-project/sglang) or the kernel folder.",
            )
    pyproject = read_pyproject(kernel_dir / "pyproject.toml")
    project = pyproject.get("project", {}) or {}
    requires = tuple(str(r) for r in (pyproject.get("build-system", {}) or {}).get("requires", []) or [])
    version = project.get("version")
    if version is None:
        for candidate in sorted(kernel_dir.glob("python/*/version.py")):
            version = version_in_file(candidate)
            if version:
                break
    files = cmake_files(kernel_dir)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    options = tuple(sorted({m.group(1) for text in texts for m in _OPTION_RE.finditer(text)}))
    min_cmake = _MIN_CMAKE_RE.search(texts[0])
    digest = hashlib.sha256()
    for f, text in zip(files, texts):
        digest.update(f.relative_to(kernel_dir).as_posix().encode() + b"\0" + text.encode() + b"\0")
    digest.update((kernel_dir / "pyproject.toml").read_bytes())
    git_root = repo_root or kernel_dir
    commit = _git(git_root, "rev-parse", "HEAD")
    if commit and repo_root is None:
        top = _git(kernel_dir, "rev-parse", "--show-toplevel")
        repo_root = Path(top) if top else None
    return KernelSource(
        path=kernel_dir,
        layout=layout,
        name=project.get("name"),
        version=version,
        sglang_version=_sglang_version(repo_root) if repo_root is not None and layout != "folder" else None,
        repo_root=repo_root,
        commit=commit,
        build_requires=requires,
        options=options,
        cmake_minimum=min_cmake.group(1) if min_cmake else None,
        fingerprint=digest.hexdigest()[:16],
        cmake_files=files,
    )
