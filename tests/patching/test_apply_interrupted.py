"""Nothing half-done: Ctrl-C, SIGTERM and SIGKILL at chosen and at random moments, a kill inside an atomic
write, a run waiting on the lock while a revert removes the state folder, a file planned where a folder
is, refused runs. Every trial runs the real CLI on a real tree and compares every byte and mode after."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apply_support import REPO_ROOT, make_diff, run_cli, small_tree, tree_hashes, write_series

from sm120kit.patching.state import STATE_DIR, StateStore
from sm120kit.util.lock import TreeLock

SEED = 13


def _many_files_tree(folder: Path, count: int = 8) -> tuple[Path, Path]:
    """A small tree and a series that changes ``count`` files and creates one: a write phase of
    ``count + 1`` files, long enough to interrupt in the middle."""
    package = small_tree(folder / "site")
    root = package.parent
    diffs = ""
    for i in range(count):
        rel = f"sglang/srt/mod{i}.py"
        (root / rel).write_text("".join(f"VALUE_{j} = {j}\n" for j in range(30)))
        diffs += make_diff(root, rel, lambda t, i=i: t.replace("VALUE_7 = 7\n", f"VALUE_7 = 7  # patched {i}\n"))
    diffs += (
        "diff --git a/sglang/srt/added.py b/sglang/srt/added.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/sglang/srt/added.py\n@@ -0,0 +1 @@\n+ADDED = True\n"
    )
    series = write_series(
        folder / "series", [{"id": "many", "diffs": {"a.diff": diffs}, "variants": [("a.diff", ">=0.5", "0.5.2")]}]
    )
    return package, series


def _files(hashes: dict) -> dict:
    """The tree's own files (without sm120kit's state folder)."""
    return {k: v for k, v in hashes.items() if not k.startswith(f"sglang/{STATE_DIR}/")}


def _stray_temp_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tmp"))


def _applied_hashes(tmp_path: Path, count: int = 8) -> dict:
    """What a complete apply leaves (tree files only), from a twin tree."""
    package, series = _many_files_tree(tmp_path / "twin", count)
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    return _files(tree_hashes(package.parent))


# -- 6: Ctrl-C and SIGTERM roll back ---------------------------------------------------------------------


@pytest.mark.parametrize("sig", ["INT", "TERM"])
@pytest.mark.parametrize("after", [1, 4, 8])
def test_ctrl_c_during_apply_rolls_back(tmp_path, sig, after):
    package, series = _many_files_tree(tmp_path)
    pristine = tree_hashes(package.parent)
    proc = run_cli(
        "apply",
        str(package),
        "--series",
        str(series),
        env={"SM120KIT_FAULT_AFTER_WRITES": str(after), "SM120KIT_FAULT_SIGNAL": sig},
    )
    assert proc.returncode == 130, proc.stderr
    assert f"Interrupted (SIG{sig}) after {after} of 9 file(s)" in proc.stderr
    assert f"the {after} file(s) it had written were put back" in proc.stderr
    assert "exactly as it was before this 'apply'" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_hashes(package.parent) == pristine  # no state folder, no temporary file either


def test_ctrl_c_during_revert_rolls_back_to_the_patched_tree(tmp_path):
    package, series = _many_files_tree(tmp_path)
    pristine = tree_hashes(package.parent)
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    patched = tree_hashes(package.parent)
    proc = run_cli("revert", str(package), env={"SM120KIT_FAULT_AFTER_WRITES": "5", "SM120KIT_FAULT_SIGNAL": "INT"})
    assert proc.returncode == 130 and "put back" in proc.stderr, proc.stderr
    now = tree_hashes(package.parent)
    assert {k: v for k, v in now.items() if "/blobs/" not in k} == {
        k: v for k, v in patched.items() if "/blobs/" not in k
    }  # the record included
    assert run_cli("status", str(package), "--series", str(series)).returncode == 0
    assert run_cli("revert", str(package)).returncode == 0
    assert tree_hashes(package.parent) == pristine


@pytest.mark.slow
def test_ctrl_c_at_random_moments_never_leaves_a_half_patched_tree(tmp_path):
    """SIGINT or SIGTERM at random moments (fixed seed): at a random write of the write phase (inside a
    write or right after a replace), or at a random wall-clock time of the whole run. The tree is wholly
    original or wholly patched, never between, and never holds a temporary file."""
    rng = random.Random(SEED)
    done = _applied_hashes(tmp_path)
    outcomes = {"rolled back": 0, "finished": 0}
    for trial in range(16):
        package, series = _many_files_tree(tmp_path / f"t{trial}")
        pristine = tree_hashes(package.parent)
        sig = rng.choice(["INT", "TERM"])
        env = dict(os.environ, NO_COLOR="1")
        timed = trial % 2 == 1
        if not timed:
            hook = rng.choice(["SM120KIT_FAULT_AFTER_WRITES", "SM120KIT_FAULT_IN_WRITE"])
            env.update({hook: str(rng.randint(1, 9)), "SM120KIT_FAULT_SIGNAL": sig})
        child = subprocess.Popen(
            [sys.executable, "-m", "sm120kit", "apply", str(package), "--series", str(series)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if timed:
            time.sleep(rng.uniform(0.2, 1.5))
            child.send_signal(getattr(signal, f"SIG{sig}"))
        _, err = child.communicate(timeout=120)
        now = tree_hashes(package.parent)
        # -2/-15: the signal came while Python was still starting, before sm120kit was running.
        assert child.returncode in (0, 130, -2, -15), err
        assert b"Traceback" not in err or child.returncode in (-2, -15)
        if not timed:
            assert child.returncode == 130 and b"were put back" in err, err
        assert not _stray_temp_files(package.parent)
        if _files(now) == done:
            outcomes["finished"] += 1
            assert (package / STATE_DIR / "state.json").is_file()
        else:
            assert now == pristine, f"trial {trial}: half-patched tree\n{err.decode()}"
            outcomes["rolled back"] += 1
    assert outcomes["rolled back"] >= 8


# -- 8: SIGKILL anywhere, temporary files included ----------------------------------------------------------


def test_kill_inside_an_atomic_write_leaves_no_temporary_file_after_repair(tmp_path):
    package, series = _many_files_tree(tmp_path)
    pristine = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series), env={"SM120KIT_FAULT_IN_WRITE": "3"})
    assert proc.returncode == -9
    left = list(_files({p: None for p in _stray_temp_files(package.parent)}))
    assert len(left) == 1 and ".sm120kit-" in left[0]  # named by the journal
    status = run_cli("status", str(package), "--series", str(series))
    assert status.returncode == 6 and "interrupted 'apply'" in status.stderr
    fixed = run_cli("apply", str(package), "--series", str(series))
    assert fixed.returncode == 0 and "repaired an interrupted run" in fixed.stderr, fixed.stderr
    assert not _stray_temp_files(package.parent)
    assert run_cli("revert", str(package)).returncode == 0
    assert tree_hashes(package.parent) == pristine


@pytest.mark.slow
def test_random_kills_are_always_repaired(tmp_path):
    """SIGKILL at a random write (fixed seed): after a replace or inside a write, during apply or revert,
    and during the repair itself. The next runs always repair, and revert is byte-identical."""
    rng = random.Random(SEED)
    package, series = _many_files_tree(tmp_path)
    pristine = tree_hashes(package.parent)
    done = _applied_hashes(tmp_path)
    for trial in range(12):
        hook = rng.choice(["SM120KIT_FAULT_AFTER_WRITES", "SM120KIT_FAULT_IN_WRITE"])
        command = rng.choice(["apply", "revert"])
        args = ["--series", str(series)] if command == "apply" else []
        run_cli(command, str(package), *args, env={hook: str(rng.randint(1, 9))})
        if rng.random() < 0.3:  # kill the repair too
            run_cli("apply", str(package), "--series", str(series), env={hook: "1"})
        # Right after a kill inside a write, its temporary file may be there: the next run removes it.
        files = {k: v for k, v in _files(tree_hashes(package.parent)).items() if not k.endswith(".tmp")}
        assert all(files.get(k) in (pristine.get(k), done.get(k)) for k in files.keys() | done.keys()), trial
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    assert _files(tree_hashes(package.parent)) == done
    assert not _stray_temp_files(package.parent)
    assert run_cli("revert", str(package)).returncode == 0
    assert tree_hashes(package.parent) == pristine


# -- 9: a run waiting on the lock while a revert finishes ------------------------------------------------


def test_waiter_sees_the_finished_revert(tmp_path):
    package, series = _many_files_tree(tmp_path)
    pristine = tree_hashes(package.parent)
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 0
    store = StateStore(package.parent)
    env = dict(os.environ, NO_COLOR="1", SM120KIT_LOCK_WAIT="60")
    with TreeLock(store.lock_path, command="revert (the test)"):
        waiter = subprocess.Popen(
            [sys.executable, "-m", "sm120kit", "revert", str(package)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        second = subprocess.Popen(
            [sys.executable, "-m", "sm120kit", "apply", str(package), "--series", str(series)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for proc in (waiter, second):  # both are waiting on the lock now (however loaded the machine)
            _wait_until_open(proc, store.lock_path)
        # What a finishing revert does while it holds the lock: originals back, then the folder goes.
        _restore_by_hand(package)
        time.sleep(1)  # the waiters poll the missing lock file meanwhile
    out_w, err_w = waiter.communicate(timeout=120)
    out_s, err_s = second.communicate(timeout=120)
    assert waiter.returncode == 0, err_w
    assert second.returncode == 0, err_s
    assert "Cannot create the lock file" not in err_w + err_s
    # Whichever ran second saw the first one's finished state; the folder is complete or absent.
    state_dir = package / STATE_DIR
    if state_dir.exists():
        assert (state_dir / ".gitignore").read_text() == "*\n" and (state_dir / "state.json").is_file()
        assert run_cli("revert", str(package)).returncode == 0
    assert tree_hashes(package.parent) == pristine


def _wait_until_open(proc: subprocess.Popen, path: Path, timeout: float = 120.0) -> None:
    """Return once ``proc`` is in its lock-wait loop: it holds ``path`` open, or it sleeps between two
    attempts (a waiter opens the lock file, fails ``flock(LOCK_NB)``, closes it and sleeps 50 ms, so the file
    is open for microseconds only; nothing else of a run sleeps before it takes the lock)."""
    target = os.path.realpath(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            with open(f"/proc/{proc.pid}/wchan") as wchan:
                if "nanosleep" in wchan.read():
                    return
            fds = os.listdir(f"/proc/{proc.pid}/fd")
        except FileNotFoundError:
            fds = []
        for fd in fds:
            try:
                if os.readlink(f"/proc/{proc.pid}/fd/{fd}") == target:
                    return
            except OSError:
                continue
        time.sleep(0.005)
    raise AssertionError(f"pid {proc.pid} never waited on {path}")


def _restore_by_hand(package: Path) -> None:
    """Put the original bytes back from the state folder's blobs and remove the folder, as revert does."""
    import json
    import shutil

    store = StateStore(package.parent)
    record = json.loads(store.state_path.read_text())
    for entry in record["files"]:
        path = package.parent / entry["path"]
        if entry["before"] is None:
            path.unlink()
        else:
            path.write_bytes((store.blobs_dir / entry["before"]).read_bytes())
    shutil.rmtree(store.dir)


# -- 10, 11: conflicts found before writing; refused runs leave nothing ---------------------------------------


def test_file_planned_where_a_folder_is_is_a_conflict(tmp_path):
    package, series = _many_files_tree(tmp_path)
    (package / "srt" / "added.py").mkdir()
    before = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 4, proc.stderr
    assert "sglang/srt/added.py is a folder, not a file" in proc.stdout
    assert tree_hashes(package.parent) == before and not (package / STATE_DIR).exists()
    for command in (["status", "--series", str(series)], ["revert"]):
        assert run_cli(command[0], str(package), *command[1:]).returncode == 0
    assert tree_hashes(package.parent) == before and not (package / STATE_DIR).exists()


def test_file_planned_below_a_regular_file_is_a_conflict(tmp_path):
    package = small_tree(tmp_path / "site")
    diff = (
        "diff --git a/sglang/srt/utils.py/x.py b/sglang/srt/utils.py/x.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/sglang/srt/utils.py/x.py\n@@ -0,0 +1 @@\n+X = 1\n"
    )
    series = write_series(
        tmp_path / "series", [{"id": "below", "diffs": {"a.diff": diff}, "variants": [("a.diff", ">=0.5", "0.5.2")]}]
    )
    before = tree_hashes(package.parent)
    proc = run_cli("apply", str(package), "--series", str(series))
    assert proc.returncode == 4 and "regular file where one of its folders should be" in proc.stdout, proc.stdout
    assert tree_hashes(package.parent) == before


def test_refused_runs_leave_no_state_folder(tmp_path):
    package, series = _many_files_tree(tmp_path)
    before = tree_hashes(package.parent)
    store = StateStore(package.parent)
    store.ensure()
    with TreeLock(store.lock_path, command="held by the test"):
        proc = run_cli("apply", str(package), "--series", str(series), env={"SM120KIT_LOCK_WAIT": "0.2"})
        assert proc.returncode == 7
    store.discard_if_unused()
    # A conflict and a dirty edit-after-apply refusal: nothing stays behind.
    (package / "srt" / "mod3.py").write_text("changed\n")
    assert run_cli("apply", str(package), "--series", str(series)).returncode == 4
    assert not (package / STATE_DIR).exists()
    (package / "srt" / "mod3.py").write_bytes(b"".join(f"VALUE_{j} = {j}\n".encode() for j in range(30)))
    assert tree_hashes(package.parent) == before
