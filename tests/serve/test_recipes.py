"""Serving recipes (recipes/serve/*.toml), `sm120kit serve` and `sm120kit recipes`.

Flags are checked against the real argument parser of each SGLang release a recipe names: the release is
downloaded from PyPI (cached) and SGLang's own ``ServerArgs.add_cli_args`` is built in a subprocess with
``PYTHONPATH`` at the release. No GPU is needed for any of it; the one test that shows the GPU check with a
card present puts a stand-in ``nvidia-smi`` on PATH (this machine has no NVIDIA GPU) and says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sm120kit.errors import RecipeError, UsageError
from sm120kit.serve.checks import validate_against
from sm120kit.serve.flags import check_flags, merge_flags, parse_extra, recipe_flags
from sm120kit.serve.gpus import ListedGpu, check_gpus, detect_gpus
from sm120kit.serve.recipe import find_recipe, list_recipes, load_recipe
from sm120kit.serve.server_args import PROBE_MODULE, ServerArgsSpec, read_server_args

SHIPPED = list_recipes()
PAIRS = [(r.name, v) for r in SHIPPED for v in r.sglang]
DENSE = "qwen3-8b-rtx5090"
MLA = "kimi-k2-thinking-8x-rtx-pro-6000"


@pytest.fixture(scope="session")
def server_args(release_dir):
    """``server_args("0.5.23")`` -> that release's parser, with every shipped recipe naming it parsed too."""
    cache: dict[str, tuple[ServerArgsSpec, list[str]]] = {}

    def get(version: str):
        if version not in cache:
            named = [r for r in SHIPPED if version in r.sglang]
            argvs = [["--model-path", r.model, *[t for u in recipe_flags(r) for t in u.argv]] for r in named]
            spec = read_server_args(sglang_root=release_dir(version), argvs=argvs)
            cache[version] = (spec, [r.name for r in named])
        return cache[version]

    return get


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("NCCL_")}
    env.pop("SGLANG_ENABLE_JIT_DEEPGEMM", None)
    env["NO_COLOR"] = "1"
    return env


def _sm120kit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sm120kit", *args], capture_output=True, text=True, env=env or _env(), timeout=600
    )


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


MINIMAL = """\
name = "{name}"
title = "t"
description = "d"
sglang = ["0.5.23"]

[model]
path = "org/model"
architecture = "dense"
quantization = "bf16"

[gpus]
count = 1
names = ["RTX 5090"]
capability = "12.0"

[flags]
attention-backend = "triton"
{extra_flags}
[env]
{env}
[notes.attention-backend]
why = "w"
sources = ["https://example.org/a"]
{extra_notes}"""


def _minimal(
    tmp_path: Path,
    name: str = "mini",
    extra_flags: str = "",
    env: str = "",
    extra_notes: str = "",
    replace: dict[str, str] | None = None,
) -> Path:
    """A small valid recipe, with extra lines and text replacements to make it invalid on purpose."""
    text = MINIMAL.format(name=name, extra_flags=extra_flags, env=env, extra_notes=extra_notes)
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    return _write(tmp_path, name, text)


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# --- the shipped recipes ---------------------------------------------------------------------------------
def test_the_shipped_recipes_cover_the_sm120_setups():
    by_name = {r.name: r for r in SHIPPED}
    assert len(SHIPPED) >= 5
    dense = by_name[DENSE]
    assert dense.gpus.count == 1 and "RTX 5090" in dense.gpus.names and dense.gpus.capability == (12, 0)
    moe = by_name["qwen3-30b-a3b-2x-rtx-pro-6000"]
    assert moe.gpus.count == 2 and any(s.name == "moe-runner-backend" for s in moe.flags)
    mla = by_name[MLA]
    assert mla.gpus.count == 8 and {"NCCL_P2P_LEVEL", "NCCL_ALGO", "NCCL_PROTO"} <= {s.name for s in mla.env}
    assert dict((s.name, s.value) for s in mla.flags)["tp-size"] == 8
    fp4 = by_name["qwen3-30b-a3b-nvfp4-rtx-pro-6000"]
    assert dict((s.name, s.value) for s in fp4.flags)["quantization"] == "modelopt_fp4"
    spark = by_name["llama-3.1-8b-dgx-spark"]
    assert spark.gpus.capability == (12, 1)
    for recipe in SHIPPED:
        flags = {s.name for s in recipe.flags}
        assert {"attention-backend", "mem-fraction-static", "context-length"} <= flags, recipe.name
        assert any(f.startswith("cuda-graph-") for f in flags), recipe.name
        for setting in recipe.flags + recipe.env:
            note = recipe.notes[setting.name]
            assert note.why and note.sources and all(s.startswith("https://") for s in note.sources)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "version"), PAIRS, ids=[f"{n}@{v}" for n, v in PAIRS])
def test_every_recipe_validates_against_each_sglang_release_it_names(server_args, name, version):
    spec, parsed = server_args(version)
    assert spec.version == version
    recipe = next(r for r in SHIPPED if r.name == name)
    validate_against(recipe, spec)  # raises RecipeError on an unknown, retired or malformed flag
    error = spec.argv_errors[parsed.index(name)]
    assert error is None, f"SGLang {version}'s own parser rejects {name}: {error}"


def test_the_argument_parser_probe_is_a_program_run_with_python_m(release_dir, tmp_path):
    """The probe is a module of its own, run as `python -m` in a fresh interpreter with PYTHONPATH at a
    cached release: it writes SGLang's options and, per command line, the parse error and what it sets.
    It imports only the standard library (and sglang), so it runs in any Python that runs SGLang."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec(PROBE_MODULE).origin)
    imported = {
        a.name.split(".")[0]
        for n in ast.walk(ast.parse(source.read_text()))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])
    }
    assert imported <= {"argparse", "json", "os", "sys", "traceback", "sglang"}, imported

    root = release_dir("0.5.23")
    out = tmp_path / "args.json"
    argvs = [["--model-path", "m", "--tp-size", "2"], ["--model-path", "m", "--no-such-flag"]]
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(root), str(source.parents[2])])}
    proc = subprocess.run(
        [sys.executable, "-m", PROBE_MODULE, str(out), json.dumps(argvs)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["version"] == "0.5.23" and Path(data["package_dir"]) == root / "sglang"
    assert any("--tp-size" in o["flags"] for o in data["options"])
    assert data["argv_errors"][0] is None and "--no-such-flag" in data["argv_errors"][1]
    assert data["argv_given"][0]["tp_size"] == 2


# --- strict loading ---------------------------------------------------------------------------------------
def test_an_unknown_key_is_rejected_with_file_line_and_suggestion(tmp_path):
    path = _minimal(tmp_path, replace={"[gpus]": '[gpus]\ncapabilty = "12.0"'})
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    text = info.value.render()
    assert f"{path}:{_line_of(path, 'capabilty')}" in text
    assert "unknown key 'capabilty' in [gpus]" in text and "Did you mean 'capability'?" in text

    path = _minimal(tmp_path, name="top", replace={"title = ": 'titel = "x"\ntitle = '})
    with pytest.raises(RecipeError, match=rf"top.toml:{_line_of(path, 'titel')}: unknown key 'titel'"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra_flags": "context-length = 4096"}, "the flag 'context-length' has no note"),
        ({"env": 'SGLANG_X = "1"'}, "the environment variable 'SGLANG_X' has no note"),
        (
            {"extra_notes": '[notes.context-lenght]\nwhy = "w"\nsources = ["https://x.org"]'},
            "the note 'context-lenght' is about no setting",
        ),
        ({"extra_flags": "enable-foo = false"}, "flag 'enable-foo' is false"),
        ({"extra_flags": "--port = 1"}, "without dashes"),
        ({"extra_flags": 'model-path = "x"'}, "does not belong in \\[flags\\]"),
        ({"extra_flags": "tp-size = 2"}, "tensor parallel size 2 is more than the 1 GPU"),
        ({'sources = ["https://example.org/a"]': 'sources = ["http://example.org/a"]'}, "not an https:// URL"),
        ({"env": "NCCL_ALGO = 1"}, "must be a string"),
        ({'capability = "12.0"': 'capability = "twelve"'}, "not a compute capability"),
    ],
    ids=[
        "flag-without-note",
        "env-without-note",
        "note-for-nothing",
        "false-switch",
        "dashes",
        "model-path",
        "tp-over-gpus",
        "http-source",
        "env-not-string",
        "bad-capability",
    ],
)
def test_malformed_recipes_are_rejected_naming_the_file(tmp_path, change, message):
    extra = {k: v for k, v in change.items() if k in ("extra_flags", "env", "extra_notes")}
    replace = {k: v for k, v in change.items() if k not in extra}
    if "extra_notes" not in extra and "extra_flags" in extra and "no note" not in message:
        key = extra["extra_flags"].split("=")[0].strip()
        extra["extra_notes"] = f'[notes."{key}"]\nwhy = "w"\nsources = ["https://x.org"]'
    path = _minimal(tmp_path, replace=replace, **extra)
    with pytest.raises(RecipeError, match=message) as info:
        load_recipe(path)
    assert str(path) in info.value.render()


def test_a_backend_without_sm120_code_and_bad_toml_are_rejected(tmp_path):
    path = _minimal(tmp_path, replace={'attention-backend = "triton"': 'attention-backend = "fa3"'})
    with pytest.raises(RecipeError, match=r"attention-backend = \"fa3\" has no code for compute capability 12"):
        load_recipe(path)
    broken = _write(tmp_path, "broken", 'name = "broken"\ntitle = \n')
    with pytest.raises(RecipeError, match=r"broken.toml: not valid TOML: .*line 2"):
        load_recipe(broken)


# --- flags against the parser ------------------------------------------------------------------------------
@pytest.mark.slow
def test_removed_flags_and_unread_switches_name_the_release(server_args, tmp_path):
    spec, _ = server_args("0.5.23")
    path = _minimal(
        tmp_path,
        extra_flags="cuda-graph-max-bs = 64",
        extra_notes='[notes.cuda-graph-max-bs]\nwhy = "w"\nsources = ["https://x.org"]',
    )
    recipe = load_recipe(path)
    with pytest.raises(RecipeError) as info:
        validate_against(recipe, spec)
    text = info.value.render()
    assert f"{path}:{_line_of(path, 'cuda-graph-max-bs =')}" in text
    assert "--cuda-graph-max-bs is not a flag of SGLang 0.5.23" in text
    assert "--cuda-graph-max-bs-decode" in text  # the names that replaced it
    assert "written for SGLang 0.5.23" in text

    # The FP4 GEMM switch of SGLang 0.5.3-0.5.4 is read by no file of 0.5.23 (a flag replaced it).
    path = _minimal(
        tmp_path,
        name="oldenv",
        env='SGLANG_USE_CUTLASS_BACKEND_FOR_FP4_GEMM = "1"',
        extra_notes='[notes.SGLANG_USE_CUTLASS_BACKEND_FOR_FP4_GEMM]\nwhy = "w"\nsources = ["https://x.org"]',
    )
    with pytest.raises(
        RecipeError,
        match=r"no file of SGLang 0\.5\.23 .* reads the environment variable "
        r"SGLANG_USE_CUTLASS_BACKEND_FOR_FP4_GEMM",
    ):
        validate_against(load_recipe(path), spec)


@pytest.mark.slow
def test_extra_flags_parse_like_sglang_and_replace_the_recipes(server_args):
    spec, _ = server_args("0.5.23")
    recipe = find_recipe(DENSE)
    warnings: list[str] = []
    extra = parse_extra(
        [
            "--port=9000",
            "--mem-fraction-static",
            "0.8",
            "--tp",
            "1",
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "--disable-cuda-graph",
        ],
        spec,
        warnings,
    )
    assert [(u.flag, u.values) for u in extra] == [
        ("--port", ("9000",)),
        ("--mem-fraction-static", ("0.8",)),
        ("--tp-size", ("1",)),
        ("--cuda-graph-bs-decode", ("1", "2")),
        ("--disable-cuda-graph", ()),
    ]
    assert any("--tp (command line) is read as --tp-size" in w for w in warnings)
    deprecated = check_flags(extra, spec)
    assert any("--disable-cuda-graph is deprecated in SGLang 0.5.23" in w for w in deprecated)
    merged, overrides = merge_flags(recipe_flags(recipe), extra, spec)
    flags = [u.flag for u in merged]
    assert flags.count("--mem-fraction-static") == 1 and flags.count("--tp-size") == 1
    assert any("--mem-fraction-static 0.8 (command line) replaces --mem-fraction-static 0.85" in o for o in overrides)
    for bad, message in (
        (["--attention-backend", "fa9"], "'fa9' is not a choice of --attention-backend"),
        (["--mem-fraction-static", "lots"], "wants a number"),
        (["--no-such-flag"], "--no-such-flag is not a flag of SGLang 0.5.23"),
        (["stray"], "Unexpected argument 'stray'"),
    ):
        with pytest.raises(UsageError, match=message):
            check_flags(parse_extra(bad, spec), spec)


# --- GPUs ----------------------------------------------------------------------------------------------------
def test_gpu_mismatch_warnings_with_a_stand_in_nvidia_smi(tmp_path, monkeypatch):
    """This machine has no NVIDIA GPU: a stand-in nvidia-smi prints what the real one prints for the
    query sm120kit makes (name, compute capability, memory), so the detection runs through the runner
    for real and the comparison sees a card. Without it on PATH, the check reports no GPU."""
    spec = find_recipe(MLA).gpus
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert detect_gpus() is None
    assert "no NVIDIA GPU found" in check_gpus(spec, None)[0]

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, 8.9, 24564'\n"
        "echo 'NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    found = detect_gpus()
    assert found == (
        ListedGpu("NVIDIA GeForce RTX 4090", (8, 9), 24564),
        ListedGpu("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0), 97887),
    )
    warnings = check_gpus(spec, found)
    assert any("2 GPU(s) found, the recipe expects 8" in w for w in warnings)
    assert any("GPU 0 is 'NVIDIA GeForce RTX 4090'" in w for w in warnings)
    assert any("GPU 0 has compute capability 8.9, the recipe is for 12.0" in w for w in warnings)
    assert not any("GPU 1" in w for w in warnings)
    assert check_gpus(spec, found[1:] * 8) == []

    # Drivers before 510 know no compute_cap field and reject the whole query: ask again without it.
    fake.write_text(
        "#!/bin/sh\ncase \"$1\" in *compute_cap*) echo 'invalid field compute_cap' >&2; exit 2;; esac\n"
        "echo 'NVIDIA GeForce RTX 5090, 32607'\n"
    )
    assert detect_gpus() == (ListedGpu("NVIDIA GeForce RTX 5090", None, 32607),)


# --- the CLI -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_dry_run_prints_the_expected_command(release_dir, tmp_path):
    root = tmp_path / "site"
    shutil.copytree(release_dir("0.5.23"), root)
    proc = _sm120kit(
        "serve",
        "--recipe",
        DENSE,
        "--sglang",
        str(root),
        "--model",
        "/models/Qwen3-8B",
        "--dry-run",
        "--",
        "--port",
        "8001",
        "--mem-fraction-static",
        "0.8",
    )
    assert proc.returncode == 0, proc.stderr
    [command] = proc.stdout.strip().splitlines()  # stdout holds the command and nothing else
    assert command == (
        f"PYTHONPATH={root} {sys.executable} -m sglang.launch_server --model-path /models/Qwen3-8B "
        "--tp-size 1 --attention-backend flashinfer --context-length 32768 --chunked-prefill-size 4096 "
        "--cuda-graph-bs-decode 1 2 4 8 16 24 32 48 64 --port 8001 --mem-fraction-static 0.8"
    )
    assert "override: --mem-fraction-static 0.8 (command line) replaces --mem-fraction-static 0.85" in proc.stderr
    assert "reading SGLang's argument parser" in proc.stderr
    assert "no NVIDIA GPU found" in proc.stderr  # a warning, not an error


@pytest.mark.slow
def test_serve_dry_run_output_can_be_evaluated_by_a_shell(release_dir, tmp_path):
    """eval "$(sm120kit serve ... --dry-run)": stdout is one shell command, whose words are the plan's argv."""
    script = (
        f'cmd="$({shlex.quote(sys.executable)} -m sm120kit serve --recipe {DENSE} --sglang '
        f'{shlex.quote(str(release_dir("0.5.23")))} --dry-run -- --port 8123 2>/dev/null)" && '
        'set -- $cmd && printf "%s\\n" "$@"'
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.splitlines()
    assert words[0].startswith("PYTHONPATH=") and words[1:4] == [sys.executable, "-m", "sglang.launch_server"]
    assert words[-2:] == ["--port", "8123"]


@pytest.mark.slow
def test_serve_json_after_the_separator_is_an_sglang_flag(release_dir):
    """'--json' after '--' is one of SGLang's flags (an unknown one), not sm120kit's --json."""
    proc = _sm120kit("serve", "--recipe", DENSE, "--sglang", str(release_dir("0.5.23")), "--dry-run", "--", "--json")
    assert proc.returncode == 2, proc.stderr
    assert "--json" in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_serve_json_plan_carries_the_environment_and_checks(release_dir):
    env = _env()
    env["NCCL_ALGO"] = "Tree"  # the user's own setting wins over the recipe's, with a warning
    proc = _sm120kit("serve", "--recipe", MLA, "--sglang", str(release_dir("0.5.23")), "--dry-run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["sglang"]["version"] == "0.5.23" and plan["sglang"]["named_by_recipe"] is True
    assert plan["argv"][1:5] == ["-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Thinking"]
    assert plan["argv"][5:9] == ["--tp-size", "8", "--trust-remote-code", "--attention-backend"]
    assert plan["env"]["NCCL_P2P_LEVEL"] == "SYS" and plan["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert "NCCL_ALGO" not in plan["env"] and plan["kept_env"] == {"NCCL_ALGO": "Tree"}
    assert any("NCCL_ALGO=Tree from your environment is kept" in w for w in plan["warnings"])
    assert plan["gpus"] is None and plan["dry_run"] is True


@pytest.mark.slow
def test_serve_rejects_an_unknown_flag_clearly(release_dir, tmp_path):
    proc = _sm120kit(
        "serve",
        "--recipe",
        DENSE,
        "--sglang",
        str(release_dir("0.5.23")),
        "--dry-run",
        "--",
        "--cuda-graph-max-bs",
        "8",
    )
    assert proc.returncode == 2
    assert "--cuda-graph-max-bs is not a flag of SGLang 0.5.23" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.count("sglang.launch_server") == 0

    path = _minimal(
        tmp_path, extra_flags="not-a-flag = 1", extra_notes='[notes.not-a-flag]\nwhy = "w"\nsources = ["https://x.org"]'
    )
    proc = _sm120kit("serve", "--recipe", str(path), "--sglang", str(release_dir("0.5.23")), "--dry-run")
    assert proc.returncode == RecipeError.exit_code, proc.stderr
    assert f"{path}:{_line_of(path, 'not-a-flag =')}: --not-a-flag is not a flag of SGLang 0.5.23" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_recipes_lists_shows_and_checks(tmp_path):
    proc = _sm120kit("recipes", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)["recipes"]
    assert sorted(r["name"] for r in listed) == sorted(r.name for r in SHIPPED)
    shown = _sm120kit("recipes", MLA)
    assert shown.returncode == 0 and "NCCL_PROTO" in shown.stdout
    assert "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html" in shown.stdout
    missing = _sm120kit("recipes", "qwen3-8b-rtx509")
    assert missing.returncode == 2 and "Did you mean 'qwen3-8b-rtx5090'" in missing.stderr

    folder = tmp_path / "serve"
    folder.mkdir()
    _minimal(folder, name="good")
    _minimal(
        folder,
        name="stale",
        extra_flags="cuda-graph-max-bs = 64",
        extra_notes='[notes.cuda-graph-max-bs]\nwhy = "w"\nsources = ["https://x.org"]',
    )
    checked = _sm120kit("recipes", "--check", "--dir", str(folder), "--json")
    assert checked.returncode == 13, checked.stderr
    results = {r["recipe"]: r for r in json.loads(checked.stdout)["checked"]}
    assert results["good"]["ok"] is True and results["stale"]["ok"] is False
    assert re.search(
        r"stale\.toml:\d+: --cuda-graph-max-bs is not a flag of SGLang 0\.5\.23", results["stale"]["error"]
    )


@pytest.mark.slow
def test_serve_replaces_itself_with_the_server_command(release_dir, tmp_path):
    """Without --dry-run, serve execs the command. SGLang's server cannot start without a GPU, so --python
    names a stand-in interpreter: it hands the argument-parser probe (`-m sm120kit.serve.server_args_probe`)
    to the real Python and, for the server command, prints the argv and environment it was started with
    instead of serving."""
    stand_in = tmp_path / "python"
    stand_in.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = "{PROBE_MODULE}" ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
        'echo "ARGV $*"\necho "NCCL_PROTO=$NCCL_PROTO PYTHONPATH=$PYTHONPATH"\n'
    )
    stand_in.chmod(0o755)
    root = release_dir("0.5.23")
    proc = _sm120kit(
        "-q", "serve", "--recipe", MLA, "--sglang", str(root), "--python", str(stand_in), "--", "--port", "30001"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-2].startswith("ARGV -m sglang.launch_server --model-path moonshotai/Kimi-K2-Thinking --tp-size 8")
    assert lines[-2].endswith("--port 30001")
    assert lines[-1] == f"NCCL_PROTO=LL PYTHONPATH={root}"


def test_serve_explains_an_sglang_that_cannot_be_imported(release_dir, tmp_path):
    """--python names an interpreter without site-packages (`python -S`): SGLang's own imports fail there,
    and serve says which module is missing and what to install, with the missing-dependency exit code."""
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S "$@"\n')
    bare.chmod(0o755)
    proc = _sm120kit(
        "serve", "--recipe", DENSE, "--sglang", str(release_dir("0.5.23")), "--python", str(bare), "--dry-run"
    )
    assert proc.returncode == 9, proc.stderr
    assert "could not import SGLang's server arguments" in proc.stderr and "No module named" in proc.stderr
    assert "Traceback" not in proc.stderr
