#!/usr/bin/env python3
"""Prove an sgl-kernel wheel built by ``sm120kit build-kernel``: one command, one report (``--json`` too).

Checks, each with its own verdict:

1. ``inspect-so``: ``sm120kit inspect-so WHEEL --require ARCH --only-loaded`` (the CLI, as a user runs it) passes,
   and what the strict form (without ``--only-loaded``) says, library by library;
2. ``cuobjdump``: NVIDIA's own reader lists the same SASS and PTX targets as sm120kit's pure-Python reader,
   for every library of the wheel (``cuobjdump`` from the nvidia-cuda-cuobjdump wheel, PATH or Triton);
3. ``loader``: the libraries SGLang loads on 12.x, read from the wheel's own Python files (the ``common_ops``
   variant its loader picks for the capability, every ``*_ops`` library its modules import) each hold SASS for
   ARCH; the ones without 12.x code by design (FA3's ``flash_ops``, FlashMLA's ``flashmla_ops``, the ``sm90/``
   copy) are named with the reason;
4. ``install``: a fresh virtual environment gets the wheel, the paired SGLang release (``--sglang``, from
   sm120kit's release cache, without its dependencies), the torch that release pins and sm120kit itself;
   ``import sgl_kernel`` runs there (with the CUDA driver stub when this machine has no driver: the import
   only registers the fat binaries) and ``sm120kit verify --arch 12.0`` judges it; fit means no error about
   sgl_kernel;
5. ``sizes``: the wheel and each library against the published wheel of the same release (``--upstream``);
6. ``build``: how far the build got and what it cost: objects built of the total (``build.ninja`` and ninja's
   log in ``--build-dir``), the summed per-object wall time from ninja's log, CPU time, wall time and peak
   memory from a ``/usr/bin/time -v`` log (``--time-log``), and ccache's counters (``CCACHE_DIR``).

Example (after ``/usr/bin/time -v -o OUT/time.txt sm120kit build-kernel SRC --arch 12.0a --out OUT ...``):

    python scripts/prove_kernel_wheel.py OUT/sglang_kernel-0.4.6.post1-*.whl --sglang 0.5.18 \\
        --upstream sglang_kernel-0.4.6.post1-cp310-abi3-manylinux2014_x86_64.whl \\
        --build-dir OUT/build --time-log OUT/time.txt --venv OUT/prove-venv

Exit code 0 when every check that ran passed, 13 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from sm120kit import runner
from sm120kit.hardware import fatbin
from sm120kit.hardware.arch import parse_arch
from sm120kit.kernel import build as build_mod

REPO = Path(__file__).resolve().parent.parent

MiB = 1 << 20


def _size(n: float) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


# -- 1. inspect-so, as the CLI runs it -----------------------------------------------------------------------
def check_inspect_so(wheel: Path, sass: str) -> dict:
    def run(*extra: str) -> tuple[int, dict]:
        proc = runner.run(
            [sys.executable, "-m", "sm120kit", "inspect-so", str(wheel), "--require", sass, "--json", *extra],
            check=False,
            extra_env={"PYTHONPATH": str(REPO)},
            what="sm120kit inspect-so",
            timeout=600,
        )
        try:
            return proc.returncode, json.loads(proc.stdout)
        except ValueError:
            return proc.returncode, {"error": (proc.stderr or proc.stdout)[-500:]}

    rc, loaded = run("--only-loaded")
    strict_rc, strict = run()
    return {
        "ok": rc == 0 and not loaded.get("lacking"),
        "command": f"sm120kit inspect-so {wheel} --require {sass} --only-loaded",
        "exit_code": rc,
        "lacking": loaded.get("lacking"),
        "not_loaded_on_sm12x": loaded.get("not_loaded_on_sm12x"),
        "strict_exit_code": strict_rc,
        "strict_lacking": strict.get("lacking"),
    }


# -- 2. cuobjdump cross-check ----------------------------------------------------------------------------------
def find_cuobjdump() -> str | None:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (CUDA 13 layout), else PATH, else Triton's copy."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    for candidate in (
        purelib / "nvidia" / "cu13" / "bin" / "cuobjdump",
        Path(shutil.which("cuobjdump") or "/nonexistent"),
        purelib / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump",
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def cuobjdump_targets(tool: str, path: Path) -> tuple[set[str], set[str]]:
    """(SASS targets, PTX targets) as ``cuobjdump --list-elf/--list-ptx`` name them (``sm_120a``)."""
    out = {}
    for flag in ("--list-elf", "--list-ptx"):
        proc = runner.run([tool, flag, str(path)], check=False, what="cuobjdump", timeout=600)
        out[flag] = set(re.findall(r"\.(sm_\d+[a-z]?)\.(?:cubin|ptx)\b", proc.stdout))
    return out["--list-elf"], out["--list-ptx"]


def check_cuobjdump(wheel: Path, libraries: tuple[fatbin.LibraryArchs, ...]) -> dict:
    tool = find_cuobjdump()
    if tool is None:
        return {"ok": None, "skipped": "cuobjdump not found (pip install nvidia-cuda-cuobjdump)"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        for lib in libraries:
            member = lib.label
            zf.extract(member, tmp)
            sass, ptx = cuobjdump_targets(tool, Path(tmp) / member)
            # cuobjdump's file names drop the "f" of family targets (sm_100f is listed as sm_100)
            ours_sass = {a[:-1] if a.endswith("f") else a for a in lib.sass}
            ours_ptx = {a[:-1] if a.endswith("f") else a for a in lib.ptx}
            rows.append(
                {
                    "library": member,
                    "agree": ours_sass == sass and ours_ptx == ptx,
                    "sm120kit": {"sass": sorted(lib.sass), "ptx": sorted(lib.ptx)},
                    "cuobjdump": {"sass": sorted(sass), "ptx": sorted(ptx)},
                }
            )
            (Path(tmp) / member).unlink()
    return {"ok": all(r["agree"] for r in rows), "tool": tool, "libraries": rows}


# -- 3. what SGLang loads on 12.x -------------------------------------------------------------------------------
_OPS_IMPORT_RE = re.compile(r"^\s*from\s+(?:sgl_kernel|\.)\s+import\s+(\w+_ops)\b|^\s*import\s+(\w+_ops)\b", re.M)


def check_loader(wheel: Path, libraries: tuple[fatbin.LibraryArchs, ...], sass: str, capability) -> dict:
    from sm120kit.verify.report import sgl_kernel_variant

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sgl_kernel/") and n.endswith(".py")]
        zf.extractall(tmp, members)
        for lib in libraries:  # empty stand-ins: the loader only globs for them
            target = Path(tmp) / lib.label
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
        package = Path(tmp) / "sgl_kernel"
        variant, variant_lib, reason = sgl_kernel_variant(package, capability)
        # the rule sgl_kernel_variant encodes, as this wheel's own loader writes it
        loader = package / "load_utils.py"
        loader_text = loader.read_text(errors="replace") if loader.is_file() else ""
        rule_seen = bool(
            re.search(r"compute_capability\s*==\s*90\s*:\s*\n\s*ops_subdir\s*=\s*\"sm90\"", loader_text)
            and re.search(r"ops_subdir\s*=\s*\"sm100\"", loader_text)
        )
        imported = set()
        for member in members:
            text = (Path(tmp) / member).read_text(errors="replace")
            for m in _OPS_IMPORT_RE.finditer(text):
                imported.add(m.group(1) or m.group(2))
    rows = []
    for lib in libraries:
        loaded, why = build_mod.loaded_on_sm12x(lib)
        is_variant = variant_lib is not None and lib.label == f"sgl_kernel/{variant_lib}"
        if lib.name == "common_ops":
            loaded = is_variant
            why = "" if is_variant else why or f"the loader picks {variant_lib} on this capability"
        rows.append(
            {
                "library": lib.label,
                "imported_by_sgl_kernel": lib.name in imported or lib.name == "common_ops",
                "loaded_on_sm12x": loaded,
                "why_not": why,
                "has_sass": sass in lib.sass,
                "ok": (sass in lib.sass) if loaded else True,
            }
        )
    return {
        "ok": bool(variant_lib)
        and rule_seen
        and all(r["ok"] for r in rows)
        and any(r["loaded_on_sm12x"] for r in rows),
        "common_ops_variant": variant_lib,
        "loader_reason": reason,
        "loader_rule_seen": rule_seen,
        "imported_ops": sorted(imported),
        "libraries": rows,
    }


# -- 4. a fresh venv with the paired SGLang release, import, verify ---------------------------------------------
def _sglang_wheel(version: str) -> Path:
    from sm120kit.sglang.releases import fetch_release
    from sm120kit.util.cache import cache_dir

    fetch_release(version)
    found = sorted((cache_dir() / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no cached wheel of SGLang {version} in {cache_dir() / 'wheels'}")
    return found[0]


def _pins(wheel: Path) -> dict[str, str]:
    from sm120kit.verify.report import parse_pins

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return parse_pins(zf.read(meta).decode(errors="replace"))


def _driver_stub(venv: Path) -> dict[str, str]:
    """LD_LIBRARY_PATH with a stand-in libcuda.so.1 when this machine has no CUDA driver (no GPU): the toolkit's
    stub when it ships one, else one made here that defines every driver function (``cu*``) the installed
    sgl_kernel libraries import, each returning CUDA_ERROR_UNKNOWN. The import then only loads the libraries
    and registers their fat binaries, as it does before any kernel runs on a real driver."""
    probe = runner.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], check=False, what="libcuda probe"
    )
    if probe.ok:
        return {}
    folder = venv / "driver-stub"
    folder.mkdir(exist_ok=True)
    link = folder / "libcuda.so.1"
    nvcc = shutil.which("nvcc")
    roots = [Path(nvcc).resolve().parent.parent] if nvcc else []
    for root in roots + [Path("/usr/local/cuda")]:
        for stub in (root / "lib64" / "stubs" / "libcuda.so", root / "targets/x86_64-linux/lib/stubs/libcuda.so"):
            if stub.is_file():
                link.unlink(missing_ok=True)
                link.symlink_to(stub)
                return {"LD_LIBRARY_PATH": str(folder), "SM120KIT_PROVE_DRIVER": f"the toolkit's stub {stub}"}
    package = next((venv / "lib").glob("python3*/site-packages/sgl_kernel"), None)
    symbols: set[str] = set()
    for lib in sorted(package.rglob("*.so")) if package else []:
        out = runner.run(["nm", "-D", "--undefined-only", str(lib)], check=False, what="nm").stdout
        symbols.update(m.group(1) for m in re.finditer(r"^\s+U (cu[A-Z]\w*)$", out, re.M))
    source = folder / "cuda_stub.c"
    source.write_text("".join(f"int {name}(void) {{ return 999; }}\n" for name in sorted(symbols)))
    made = runner.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(link), str(source)],
        check=False,
        what="driver stub",
    )
    if not made.ok:
        return {}
    return {
        "LD_LIBRARY_PATH": str(folder),
        "SM120KIT_PROVE_DRIVER": f"a stub made here ({len(symbols)} driver functions: {' '.join(sorted(symbols))})",
    }


def check_install(wheel: Path, sglang: str, venv: Path, arch: str) -> dict:
    sglang_wheel = _sglang_wheel(sglang)
    pins = _pins(sglang_wheel)
    torch_pin = pins.get("torch")
    kernel_pin = pins.get("sglang-kernel") or pins.get("sgl-kernel")
    steps = []

    def step(argv, what, env=None, timeout=3600):
        proc = runner.run(argv, check=False, extra_env=env or {}, what=what, timeout=timeout)
        steps.append({"what": what, "exit_code": proc.returncode, "tail": (proc.stdout + proc.stderr)[-800:]})
        return proc

    if not (venv / "bin" / "python").is_file():
        step([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    py = str(venv / "bin" / "python")
    installs = [
        ([py, "-m", "pip", "install", "--no-deps", str(sglang_wheel)], f"install SGLang {sglang} (no dependencies)"),
        ([py, "-m", "pip", "install", f"torch{torch_pin or ''}"], f"install torch{torch_pin or ''}"),
        ([py, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)], f"install {wheel.name}"),
        ([py, "-m", "pip", "install", str(REPO)], "install sm120kit"),
    ]
    for argv, what in installs:
        if not step(argv, what).ok:
            return {"ok": False, "failed_at": what, "steps": steps}
    env = _driver_stub(venv)
    imported = step(
        [py, "-c", "import sgl_kernel, torch; print(sgl_kernel.__file__); print(torch.ops.sgl_kernel)"],
        "import sgl_kernel",
        env,
    )
    verify = runner.run(
        [py, "-m", "sm120kit", "verify", "--arch", arch, "--no-audits", "--json"],
        check=False,
        extra_env=env,
        what="sm120kit verify",
        timeout=1800,
    )
    try:
        report = json.loads(verify.stdout)
    except ValueError:
        report = {}
    flags = report.get("report", report).get("flags", []) if isinstance(report, dict) else []
    kernel_errors = [f for f in flags if f.get("component") == "sgl_kernel" and f.get("severity") == "error"]
    return {
        "ok": imported.ok and bool(report) and not kernel_errors,
        "venv": str(venv),
        "sglang": sglang,
        "sglang_pins": pins,
        "wheel_matches_pin": kernel_pin is None or kernel_pin.lstrip("=") in wheel.name,
        "driver": env.get("SM120KIT_PROVE_DRIVER", "the machine's libcuda.so.1"),
        "import_ok": imported.ok,
        "import_output": (imported.stdout + imported.stderr)[-600:],
        "verify_exit_code": verify.returncode,
        "verify_verdict": report.get("verdict") if isinstance(report, dict) else None,
        "verify_nothing_verified": report.get("nothing_verified_reason") if isinstance(report, dict) else None,
        "verify_flags": flags,
        "verify_sgl_kernel": report.get("report", {}).get("sgl_kernel") if isinstance(report, dict) else None,
        "sgl_kernel_errors": kernel_errors,
        "steps": steps,
    }


# -- 5. sizes against the published wheel -----------------------------------------------------------------------
def sizes(wheel: Path, libraries, upstream: Path | None) -> dict:
    ours = {lib.label: lib.size for lib in libraries}
    data = {"wheel": wheel.stat().st_size, "libraries": ours, "libraries_total": sum(ours.values())}
    if upstream is None:
        return data
    theirs = {lib.label: lib.size for lib in fatbin.inspect_wheel(upstream)}
    data["upstream"] = {
        "wheel_file": str(upstream),
        "wheel": upstream.stat().st_size,
        "libraries": theirs,
        "libraries_total": sum(theirs.values()),
    }
    data["ratio_wheel"] = round(upstream.stat().st_size / max(wheel.stat().st_size, 1), 2)
    data["ratio_libraries"] = round(sum(theirs.values()) / max(sum(ours.values()), 1), 2)
    data["ratio_per_library"] = {k: round(theirs[k] / ours[k], 2) for k in ours if k in theirs and ours[k]}
    return data


# -- 6. build figures -------------------------------------------------------------------------------------------
def _ninja_log_seconds(build_dir: Path) -> tuple[float, int]:
    """Summed wall time of the newest record of each output in .ninja_log (milliseconds in the file)."""
    newest: dict[str, float] = {}
    try:
        lines = (build_dir / ".ninja_log").read_text(errors="replace").splitlines()
    except OSError:
        return 0.0, 0
    for line in lines:
        fields = line.split("\t")
        if len(fields) >= 4 and fields[0].isdigit() and fields[1].isdigit():
            newest[fields[3]] = (int(fields[1]) - int(fields[0])) / 1000
    return sum(newest.values()), len(newest)


def parse_time_log(path: Path) -> dict:
    """``/usr/bin/time -v`` output: user and system CPU seconds, wall seconds, peak RSS of the largest process."""
    text = path.read_text(errors="replace")

    def field(name: str) -> str | None:
        m = re.search(rf"^\s*{re.escape(name)}:\s*(.+)$", text, re.M)
        return m.group(1).strip() if m else None

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
    seconds = None
    if wall:
        parts = [float(p) for p in wall.split(":")]
        seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    user, system = field("User time (seconds)"), field("System time (seconds)")
    rss = field("Maximum resident set size (kbytes)")
    return {
        "cpu_seconds": round(float(user) + float(system), 1) if user and system else None,
        "user_seconds": float(user) if user else None,
        "wall_seconds": seconds,
        "peak_rss_bytes": int(rss) * 1024 if rss else None,
        "exit_status": field("Exit status"),
    }


def build_figures(build_dir: Path | None, time_log: Path | None) -> dict:
    data: dict = {}
    if build_dir is not None:
        counted = build_mod.objects_built(build_dir)
        seconds, steps = _ninja_log_seconds(build_dir)
        data.update(
            objects_built=counted[0] if counted else None,
            objects_total=counted[1] if counted else None,
            ninja_steps_logged=steps,
            ninja_step_seconds=round(seconds, 1),
        )
    if time_log is not None and time_log.is_file():
        data["time"] = parse_time_log(time_log)
    ccache = shutil.which("ccache") or shutil.which("ccache", path=str(Path(sys.executable).parent))
    if ccache and os.environ.get("CCACHE_DIR"):
        proc = runner.run([ccache, "--print-stats"], check=False, what="ccache --print-stats")
        stats = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
        keys = ("direct_cache_hit", "preprocessed_cache_hit", "cache_miss", "cache_size_kibibyte", "files_in_cache")
        data["ccache"] = {k: int(stats[k]) for k in keys if k in stats and stats[k].isdigit()}
    return data


# -- report -----------------------------------------------------------------------------------------------------
def render(report: dict) -> str:
    out = [f"wheel: {report['wheel']} ({_size(report['sizes']['wheel'])}), target {report['sass']}"]

    def verdict(ok) -> str:
        return {True: "PASS", False: "FAIL", None: "not run"}[ok]

    insp = report["inspect_so"]
    out.append(f"\n1. inspect-so: {verdict(insp['ok'])}  ({insp['command']}: exit {insp['exit_code']})")
    for lib, why in (insp.get("not_loaded_on_sm12x") or {}).items():
        out.append(f"   not loaded on 12.x: {lib}: {why}")
    out.append(f"   without --only-loaded: exit {insp['strict_exit_code']}, lacking {insp['strict_lacking'] or 'none'}")
    cuo = report["cuobjdump"]
    out.append(f"\n2. cuobjdump agrees with sm120kit's reader: {verdict(cuo['ok'])} {cuo.get('skipped', '')}")
    for row in cuo.get("libraries", []):
        out.append(
            f"   {'=' if row['agree'] else 'DIFFERS'} {row['library']}: SASS {' '.join(row['cuobjdump']['sass']) or '-'}"
            f", PTX {' '.join(row['cuobjdump']['ptx']) or '-'}"
        )
    load = report["loader"]
    out.append(f"\n3. libraries SGLang loads on 12.x hold {report['sass']}: {verdict(load['ok'])}")
    seen = "as its load_utils.py says" if load["loader_rule_seen"] else "load_utils.py NOT as expected"
    out.append(f"   loader picks {load['common_ops_variant']} ({load['loader_reason']}; {seen})")
    for row in load["libraries"]:
        state = ("holds " + report["sass"]) if row["has_sass"] else ("LACKS " + report["sass"])
        where = "loaded on 12.x" if row["loaded_on_sm12x"] else f"not loaded on 12.x ({row['why_not']})"
        out.append(f"   {row['library']}: {where}; {state}")
    inst = report.get("install")
    if inst is None:
        out.append("\n4. fresh venv + SGLang + verify: not run (--no-install)")
    else:
        out.append(f"\n4. fresh venv with SGLang {inst.get('sglang')}, import, verify: {verdict(inst['ok'])}")
        if inst.get("failed_at"):
            out.append(f"   failed at: {inst['failed_at']}: {inst['steps'][-1]['tail'][-300:]}")
        else:
            out.append(f"   venv {inst['venv']}; driver: {inst['driver']}; import sgl_kernel: {inst['import_ok']}")
            out.append(
                f"   sm120kit verify --arch 12.0: exit {inst['verify_exit_code']}, verdict {inst['verify_verdict']}; "
                f"sgl_kernel errors: {len(inst['sgl_kernel_errors'])}"
            )
            if inst.get("verify_nothing_verified"):
                out.append(f"   ({inst['verify_nothing_verified']})")
            vk = inst.get("verify_sgl_kernel") or {}
            out.append(f"   verify: sgl_kernel {vk.get('version')}, loader picks {vk.get('variant_library')}")
            for flag in inst["verify_flags"]:
                out.append(f"   [{flag.get('severity')}] {flag.get('component')}: {flag.get('message')}")
    sz = report["sizes"]
    out.append("\n5. sizes")
    up = sz.get("upstream")
    out.append(
        f"   wheel {_size(sz['wheel'])}"
        + (f" vs published {_size(up['wheel'])} ({sz['ratio_wheel']}x smaller)" if up else "")
    )
    out.append(
        f"   libraries {_size(sz['libraries_total'])}"
        + (f" vs {_size(up['libraries_total'])} ({sz['ratio_libraries']}x)" if up else "")
    )
    for label, size in sz["libraries"].items():
        theirs = up["libraries"].get(label) if up else None
        out.append(f"   {label}: {_size(size)}" + (f" vs {_size(theirs)}" if theirs else ""))
    if up:
        for label in sorted(set(up["libraries"]) - set(sz["libraries"])):
            out.append(f"   {label}: not built vs {_size(up['libraries'][label])}")
    fig = report.get("build") or {}
    if fig:
        out.append("\n6. build")
        if fig.get("objects_total") is not None:
            out.append(f"   objects built: {fig['objects_built']} of {fig['objects_total']}")
            out.append(f"   summed ninja step wall time: {fig['ninja_step_seconds'] / 3600:.2f} h")
        t = fig.get("time")
        if t:
            out.append(
                f"   /usr/bin/time: CPU {t['cpu_seconds']} s, wall {t['wall_seconds']} s, peak RSS "
                f"{(t['peak_rss_bytes'] or 0) / (1 << 30):.1f} GiB (largest single process)"
            )
        if fig.get("ccache"):
            out.append(f"   ccache: {fig['ccache']}")
    out.append(f"\nverdict: {'PASS' if report['ok'] else 'FAIL'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--arch", default="12.0a", help="the target the wheel was built for (default 12.0a)")
    ap.add_argument("--sglang", help="the SGLang release the kernel pairs with (e.g. 0.5.18); needed for step 4")
    ap.add_argument("--upstream", type=Path, help="the published wheel of the same kernel release, for sizes")
    ap.add_argument("--build-dir", type=Path, help="build-kernel's OUT/build, for the build figures")
    ap.add_argument("--time-log", type=Path, help="the output of /usr/bin/time -v around build-kernel")
    ap.add_argument("--venv", type=Path, help="where to create the fresh venv (default: beside the wheel)")
    ap.add_argument("--no-install", action="store_true", help="skip step 4 (fresh venv, import, verify)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    target = parse_arch(args.arch)
    sass, capability = target.sass, target.capability
    wheel = args.wheel.resolve()
    libraries = fatbin.inspect_wheel(wheel)
    report: dict = {"wheel": str(wheel), "sass": sass}
    report["inspect_so"] = check_inspect_so(wheel, sass)
    report["cuobjdump"] = check_cuobjdump(wheel, libraries)
    report["loader"] = check_loader(wheel, libraries, sass, capability)
    if not args.no_install:
        if not args.sglang:
            ap.error("--sglang VERSION is needed for the install step (or pass --no-install)")
        venv = (args.venv or wheel.parent / "prove-venv").resolve()
        report["install"] = check_install(wheel, args.sglang, venv, f"{capability[0]}.{capability[1]}")
    report["sizes"] = sizes(wheel, libraries, args.upstream.resolve() if args.upstream else None)
    report["build"] = build_figures(args.build_dir, args.time_log)
    verdicts = [report[k]["ok"] for k in ("inspect_so", "cuobjdump", "loader", "install") if k in report]
    report["ok"] = all(v is not False for v in verdicts)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["ok"] else 13


if __name__ == "__main__":
    sys.exit(main())
