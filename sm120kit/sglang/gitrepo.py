"""An SGLang git clone, read for upgrade checks: fetch, temporary worktrees, files at tags, line history.

:class:`SglangClone` never touches the user's checkout: a ref is checked out in a temporary worktree
(``git worktree add --detach``) that is removed again when the ``with`` block ends, whatever happens in
it. Fetch and worktrees go through gitpython; the read-only history queries (``git log -L``,
``git show``, ``git describe``) go through :func:`sm120kit.runner.run`, so ``-v`` shows them.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sm120kit import runner
from sm120kit.errors import MissingDependency, NotSglangTree, ToolFailed, UsageError
from sm120kit.util.report import Step, tell

PACKAGE_PREFIX = "python"
"""Where a clone of SGLang keeps the folder that holds ``sglang/``."""

_COMMIT_TAG = "sm120kit-commit "


@dataclass(frozen=True)
class Commit:
    """One upstream commit, as a conflict report names it."""

    sha: str
    date: str
    author: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]

    def describe(self) -> str:
        return f"{self.short} {self.date} {self.subject} ({self.author})"

    def to_json(self) -> dict:
        return {"sha": self.sha, "date": self.date, "author": self.author, "subject": self.subject}


def _git_module():
    try:
        import git
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise MissingDependency("gitpython is not installed.", hint="pip install gitpython") from exc
    return git


class SglangClone:
    """A git clone of SGLang at ``path`` (its working tree root, or any folder inside it)."""

    def __init__(self, path: str | Path) -> None:
        git = _git_module()
        given = Path(path).expanduser()
        if not given.exists():
            raise NotSglangTree(
                f"The git clone {given} does not exist.", hint="Pass --repo with the path of an SGLang git clone."
            )
        try:
            self.repo = git.Repo(given, search_parent_directories=True)
        except git.InvalidGitRepositoryError:
            raise NotSglangTree(
                f"{given.resolve()} is not inside a git repository, so --ref cannot be used on it.",
                hint="Pass --repo with an SGLang git clone (git clone https://github.com/sgl-project/sglang).",
            ) from None
        if self.repo.bare or not self.repo.working_tree_dir:
            raise NotSglangTree(f"{given.resolve()} is a bare repository.", hint="Pass a clone with a working tree.")
        self.root = Path(self.repo.working_tree_dir).resolve()

    # -- refs --------------------------------------------------------------------------------------------
    def fetch(self, on_debug: Step | None = None) -> list[str]:
        """Fetch every remote (branches and tags); the names fetched. A clone without remotes is fine."""
        git = _git_module()
        fetched = []
        for remote in self.repo.remotes:
            tell(on_debug, f"git fetch {remote.name} --tags")
            try:
                remote.fetch(tags=True)
            except git.GitCommandError as exc:
                raise ToolFailed(
                    f"git fetch {remote.name} failed in {self.root}.",
                    argv=list(exc.command),
                    returncode=exc.status,
                    output_tail=str(exc.stderr or "").strip(),
                    hint="Check the network and the remote URL, or pass --no-fetch to check the refs as they are.",
                ) from None
            fetched.append(remote.name)
        return fetched

    def resolve(self, ref: str) -> str:
        """The commit SHA ``ref`` names; :class:`UsageError` naming the clone when it names none."""
        try:
            return self.repo.commit(ref).hexsha
        except Exception:  # noqa: BLE001 - gitpython raises several kinds for a bad name
            remotes = ", ".join(r.name for r in self.repo.remotes) or "none"
            raise UsageError(
                f"'{ref}' does not name a commit in the git clone {self.root} (remotes: {remotes}).",
                hint="Give a branch (origin/main), a tag (v0.5.23) or a commit SHA that the clone has.",
            ) from None

    def has_tag(self, tag: str) -> bool:
        return tag_exists(self.root, tag)

    def release_at(self, sha: str) -> tuple[str | None, bool]:
        """The release a commit is (a ``v<version>`` tag on it: exact) or follows (the nearest such tag);
        :func:`release_of_commit`."""
        found = release_of_commit(self.root, sha)
        return found.release, found.exact

    # -- worktrees ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def worktree(self, ref: str) -> Iterator[Path]:
        """Check ``ref`` out in a temporary worktree; yield its root; remove it afterwards."""
        git = _git_module()
        sha = self.resolve(ref)
        holder = Path(tempfile.mkdtemp(prefix="sm120kit-worktree-"))
        path = holder / "sglang"
        try:
            try:
                self.repo.git.worktree("add", "--detach", str(path), sha)
            except git.GitCommandError as exc:
                raise ToolFailed(
                    f"git worktree add failed for {ref} in {self.root}.",
                    argv=list(exc.command),
                    returncode=exc.status,
                    output_tail=str(exc.stderr or "").strip(),
                ) from None
            yield path
        finally:
            with contextlib.suppress(Exception):
                self.repo.git.worktree("remove", "--force", str(path))
            shutil.rmtree(holder, ignore_errors=True)
            with contextlib.suppress(Exception):
                self.repo.git.worktree("prune")

    def package_prefix(self, worktree: Path) -> str:
        """The folder (relative to the clone root) that holds ``sglang/``: ``python`` for SGLang."""
        for prefix in (PACKAGE_PREFIX, ""):
            if (worktree / prefix / "sglang" / "__init__.py").is_file():
                return prefix
        raise NotSglangTree(
            f"The checked-out ref in {self.root} has no python/sglang/__init__.py: this clone is not SGLang.",
            hint="Pass --repo with a clone of sgl-project/sglang.",
        )

    # -- history -----------------------------------------------------------------------------------------
    def show(self, rev: str, path: str) -> str | None:
        """The text of ``path`` (relative to the clone root) at ``rev``; ``None`` when absent."""
        result = runner.run(["git", "-C", self.root, "show", f"{rev}:{path}"], check=False, what="git show")
        return result.stdout if result.ok else None

    def line_history(
        self, since: str, until: str, path: str, first: int | None = None, last: int | None = None, limit: int = 10
    ) -> list[Commit]:
        """Commits in ``since..until`` that changed lines ``first..last`` of ``path`` as it is at ``until``
        (``git log -L``); the whole file's commits when no lines are given. Newest first."""
        fmt = f"--format={_COMMIT_TAG}%H%x1f%ad%x1f%an%x1f%s"
        if first is not None and last is not None:
            argv = ["git", "-C", self.root, "log", fmt, "--date=short", f"-L{first},{last}:{path}", f"{since}..{until}"]
        else:
            argv = ["git", "-C", self.root, "log", fmt, "--date=short", f"-n{limit}", f"{since}..{until}", "--", path]
        result = runner.run(argv, check=False, what="git log")
        if not result.ok:
            return []
        commits = []
        for line in result.stdout.splitlines():
            if line.startswith(_COMMIT_TAG):
                sha, date, author, subject = (line[len(_COMMIT_TAG) :].split("\x1f") + ["", "", ""])[:4]
                commits.append(Commit(sha=sha, date=date, author=author, subject=subject))
        return commits[:limit]


def release_tag(tag: str) -> str | None:
    """``v0.5.23`` -> ``"0.5.23"``; None for a tag that does not name a release (``v<version>``)."""
    match = re.fullmatch(r"v(\d+\.\d+.*)", tag.strip())
    if not match:
        return None
    try:
        Version(match.group(1))
    except InvalidVersion:
        return None
    return match.group(1)


@dataclass(frozen=True)
class CommitRelease:
    """The release tags of one commit: those on it, else the release it follows."""

    tagged: tuple[tuple[str, str], ...] = ()  # (tag, release) of each release tag on the commit
    nearest: tuple[str, str] | None = None  # (tag, release) of the release it follows, when none is on it
    readable: bool = True  # False when git could not list the tags (no git, not a repository)
    fork: str | None = None  # where the release's branch leaves the commit's history (None: an ancestor tag)

    @property
    def release(self) -> str | None:
        if self.tagged:
            return self.tagged[0][1]
        return self.nearest[1] if self.nearest else None

    @property
    def exact(self) -> bool:
        return bool(self.tagged)

    @property
    def tag(self) -> str | None:
        if self.tagged:
            return self.tagged[0][0]
        return self.nearest[0] if self.nearest else None

    def describe(self) -> str:
        """How the release was found, in words."""
        if self.tagged:
            return f"the tag at the commit ({self.tag})"
        if self.nearest is None:
            return "no release tag precedes the commit"
        if self.fork is None:
            return f"the newest release tag in the commit's history, {self.tag} (git describe)"
        return (
            f"the newest release that branched off the commit's history: {self.tag}, whose branch leaves it "
            f"at {self.fork[:12]}"
        )


def _git_lines(root: str | Path, *args: str, what: str) -> list[str] | None:
    found = runner.run(["git", "-C", root, *args], check=False, what=what)
    return found.stdout.split() if found.ok else None


def tag_exists(root: str | Path, tag: str) -> bool:
    """Whether the repository at ``root`` has the tag ``tag``."""
    try:
        return runner.run(
            ["git", "-C", root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}"], check=False, what="git rev-parse"
        ).ok
    except (MissingDependency, ToolFailed):
        return False


def release_of_commit(root: str | Path, rev: str = "HEAD", *, follow: bool = True) -> CommitRelease:
    """The one reader of a commit's release, in the repository at ``root``: the ``v<version>`` tags on
    ``rev`` (the commit is exactly that release), else (unless ``follow`` is off) the release it follows.

    SGLang tags its releases on release branches cut from main (from 0.5.7 on), so main's own history
    holds only old tags: ``git describe`` on a 2026 main commit names v0.5.6.post2. The release a commit
    follows is therefore found among all release tags that do not contain it (those come after it): the one
    whose history meets the commit's latest, either a tag in the commit's history or the point where a release
    branch leaves it; on a tie the highest version. A main commit made after the 0.5.18 branch was cut
    follows 0.5.18; a commit on the 0.5.10 branch after v0.5.10 follows 0.5.10, not the later releases
    whose branches left main before it.
    """
    try:
        listed = runner.run(["git", "-C", root, "tag", "--points-at", rev], check=False, what="git tag")
    except (MissingDependency, ToolFailed):
        return CommitRelease(readable=False)
    if not listed.ok:
        return CommitRelease(readable=False)
    tagged = tuple((t, r) for t in listed.stdout.split() if (r := release_tag(t)))
    if tagged or not follow:
        return CommitRelease(tagged=tagged)
    refs = runner.run(
        ["git", "-C", root, "for-each-ref", "refs/tags/v*", "--format=%(refname:strip=2) %(objectname) %(*objectname)"],
        check=False,
        what="git for-each-ref",
    )
    history = _git_lines(root, "rev-list", rev, what="git rev-list")
    containing = _git_lines(root, "tag", "--contains", rev, "v*", what="git tag --contains")
    if not refs.ok or history is None or containing is None:
        return CommitRelease()
    position = {sha: index for index, sha in enumerate(history)}  # 0: the commit itself, newest first
    commits: dict[str, str] = {}
    for line in refs.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and release_tag(parts[0]) and parts[0] not in containing:
            commits[parts[0]] = parts[-1]  # the peeled commit of an annotated tag, else the tag's commit
    best: tuple[int, Version] | None = None
    chosen: tuple[str, str | None] | None = None

    def consider(tag: str, meet: int, fork: str | None) -> None:
        nonlocal best, chosen
        key = (-meet, Version(release_tag(tag)))
        if best is None or key > best:
            best, chosen = key, (tag, fork)

    for tag, sha in commits.items():
        if sha in position:
            consider(tag, position[sha], None)
    others = [tag for tag, sha in commits.items() if sha not in position]
    if others:
        walked = runner.run(
            ["git", "-C", root, "rev-list", "--boundary", "--stdin"],
            check=False,
            what="git rev-list --boundary",
            input="\n".join(others + [f"^{rev}"]) + "\n",
        )
        forks = [line[1:] for line in walked.stdout.split() if line.startswith("-")] if walked.ok else []
        forks = [sha for sha in forks if sha in position]
        if forks:
            fork = min(forks, key=position.__getitem__)
            on_it = set(_git_lines(root, "tag", "--contains", fork, "v*", what="git tag --contains") or ())
            for tag in others:
                if tag in on_it:
                    consider(tag, position[fork], fork)
    if chosen is None:
        return CommitRelease()
    tag, fork = chosen
    return CommitRelease(nearest=(tag, release_tag(tag)), fork=fork)
