"""Shared fixtures: real SGLang releases from PyPI, laid out as an installed package and as a git clone.

Releases are downloaded once into the sm120kit cache (``$SM120KIT_CACHE_DIR``; CI points it at a folder it
keeps between steps) and copied into each test's ``tmp_path``; nothing here is a mock of SGLang.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

import git
import pytest
from repo_paths import DATA_DIR, REPO_ROOT, SCRIPTS_DIR, SUPPORT_DIR, TESTS_DIR  # noqa: F401 (the tests import them from here)

from sm120kit.sglang import releases

# The releases the patch manager is tested on (issue: patch manager) and the wider series matrix.
CORE_RELEASES = ("0.5.2", "0.5.6", "0.5.10", "0.5.17", "0.5.23")
SERIES_RELEASES = ("0.5.2", "0.5.4", "0.5.6.post2", "0.5.8", "0.5.10", "0.5.14", "0.5.17", "0.5.20", "0.5.23")

QUICK_RELEASE = "0.5.23"  # the release of CORE_RELEASES that the quick loop (-m "not slow") runs


def pytest_configure(config):
    """Let SIGINT reach the CLI runs the tests start. A shell that starts the suite as a background job
    (``.ci/run &`` in a script, ``nohup``) starts it with SIGINT ignored; every process started from it
    inherits that, and Python installs no KeyboardInterrupt handler in a process that starts with SIGINT
    ignored. The tests that interrupt a run with SIGINT (``SM120KIT_FAULT_SIGNAL=INT``) then see the signal
    dropped where no sm120kit handler is set yet (the fault point before the tree lock): apply exits 0
    where 130 is due. With a handler here, each run starts with SIGINT at its default, as from a terminal."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The cubins NVRTC compiles for the MLA CUDA kernels (the kernels' own cache, sm120_mla_nvrtc.py) go where the
    # audit's probes keep theirs (AuditCache.nvrtc_dir), not into the user's ~/.cache: each distinct build
    # (source, target, flags) is compiled for real once per cache, and the tests and audits of a run share it.
    from sm120kit.audit.cache import AuditCache

    os.environ.setdefault("SGLANG_SM120_MLA_CACHE_DIR", str(AuditCache().nvrtc_dir))


def _work_units(config) -> bool:
    # a pytest-xdist worker sees --dist as "no" and the group mode as option.loadgroup
    return getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup"


def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (scripts/test.sh), order the tests by work unit, heaviest first
    (tests/support/work_units.py); any other run keeps the collection as it is."""
    if _work_units(config):
        import work_units

        work_units.deal(items)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before pytest-xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: the work units of tests/support/work_units.py."""
    if _work_units(config):
        import work_units

        return work_units.scheduler(config, log)
    return None


def quick_on_one(versions: tuple[str, ...], quick: str = QUICK_RELEASE) -> list:
    """Parametrize values for ``versions``, every one but ``quick`` marked slow."""
    return [v if v == quick else pytest.param(v, marks=pytest.mark.slow) for v in versions]


def quick_first(values: list) -> list:
    """Parametrize values: the first runs in the quick loop, the others (the same check on more inputs) are
    marked slow."""
    return values[:1] + [pytest.param(v, marks=pytest.mark.slow) for v in values[1:]]


@pytest.fixture(scope="session")
def release_dir():
    """``release_dir("0.5.23")`` -> the cached, unpacked release (read-only by convention: copy it first)."""
    return lambda version: releases.fetch_release(version)


@pytest.fixture(scope="session")
def _git_templates(tmp_path_factory, release_dir):
    made: dict[str, Path] = {}

    def make(version: str) -> Path:
        if version not in made:
            repo_dir = tmp_path_factory.mktemp(f"sglang-git-{version}") / "sglang"
            shutil.copytree(release_dir(version) / "sglang", repo_dir / "python" / "sglang")
            (repo_dir / "README.md").write_text(f"SGLang {version} (test clone built from the PyPI wheel)\n")
            repo = git.Repo.init(repo_dir, initial_branch="main")
            with repo.config_writer() as cfg:
                cfg.set_value("user", "name", "sm120kit tests")
                cfg.set_value("user", "email", "tests@sm120kit.invalid")
                # No background "git gc --auto" (a release commit has > 6700 loose objects): it would
                # pack and delete objects while a test copies the template.
                cfg.set_value("gc", "auto", "0")
            repo.git.add("-A")
            repo.git.commit("-q", "-m", f"SGLang {version}")
            repo.git.tag(f"v{version}")
            made[version] = repo_dir
        return made[version]

    return make


@pytest.fixture
def installed_tree(tmp_path, release_dir):
    """``installed_tree("0.5.23")`` -> a fresh ``site-packages`` folder holding ``sglang/`` + dist-info.

    ``link=True``: the files are hard links to the cached release instead of copies (0.1 s instead of 1-5 s for
    the 135 MB of 0.5.23 on the 2-core machine), for a test that writes to the tree's files only through the
    patch manager, which replaces each file it writes (temporary file + rename), never writing into a link, or
    into files the patch manager wrote first; ``copy=`` names the release's files (relative to site-packages)
    the test edits itself, which are copies. A write into a linked file would change the cached release: the
    test then fails at teardown, naming the file."""
    linked: list[tuple[Path, dict[str, tuple[int, int, int]]]] = []

    def make(version: str, *, link: bool = False, copy: Iterable[str] = ()) -> Path:
        site = tmp_path / f"site-packages-{version}"
        source = release_dir(version)
        if not link:
            shutil.copytree(source, site)
            return site / "sglang"
        own = {str(site / rel) for rel in copy}
        seen: dict[str, tuple[int, int, int]] = {}

        def link_or_copy(src: str, dst: str) -> str:
            if dst not in own:
                try:
                    os.link(src, dst)
                except OSError:  # another file system than the cache: a copy
                    pass
                else:
                    info = os.stat(src)
                    seen[src] = (info.st_size, info.st_mode, info.st_mtime_ns)
                    return dst
            return shutil.copy2(src, dst)

        shutil.copytree(source, site, copy_function=link_or_copy)
        linked.append((source, seen))
        return site / "sglang"

    yield make
    for source, seen in linked:
        changed = []
        for src, before in seen.items():
            info = os.stat(src)
            if (info.st_size, info.st_mode, info.st_mtime_ns) != before:
                changed.append(src)
        assert not changed, (
            f"the test wrote into {len(changed)} hard-linked file(s) of the cached release {source}, changing the "
            f"cache itself: {changed[:5]}. Delete {source} (the next run unpacks it again from the cached wheel) "
            "and name the files the test edits in installed_tree(..., copy=...)."
        )


@pytest.fixture
def git_clone_tree(tmp_path, _git_templates):
    """``git_clone_tree("0.5.23")`` -> a fresh git clone root (files under ``python/sglang``, committed)."""

    def make(version: str) -> Path:
        dest = tmp_path / f"sglang-clone-{version}"
        shutil.copytree(_git_templates(version), dest, symlinks=True)
        return dest

    return make


@pytest.fixture(scope="session")
def shared_triton_dir() -> Path:
    """The Triton kernel cache of ``sm120kit audit`` itself (``$SM120KIT_CACHE_DIR/triton-audit/triton``), shared
    by every audit test of the run, the pytest-xdist workers and the command-line audits of
    test_audit_patched_releases.py alike (Triton writes each entry to a temporary file and renames it, so they
    can share it). A kernel is still compiled for real once per cache; later tests that compile the same
    source for the same target (the patched trees' kernels, which several files audit) read its binary and
    metadata (the shared memory the audit checks) from here instead of compiling again. Each test keeps its
    own audit results (:func:`audit_cache`), so none of them is answered without a probe."""
    from sm120kit.audit.cache import AuditCache

    folder = AuditCache().triton_dir
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def audit_cache(shared_triton_dir):
    """``audit_cache(folder)`` -> an empty :class:`AuditCache` (no results yet) in ``folder`` whose Triton
    kernel cache is the run's shared one (:func:`shared_triton_dir`)."""
    from sm120kit.audit.cache import AuditCache

    class _SharedTriton(AuditCache):
        @property
        def triton_dir(self) -> Path:
            return shared_triton_dir

    return lambda folder: _SharedTriton(Path(folder))
