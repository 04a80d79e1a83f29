"""Hardware facts live in sm120kit/hardware/ only: no module elsewhere tests a capability against 12 by hand or
writes SM120's shared-memory figure (101376) itself; they call ``hardware.arch.is_sm12x`` and read
``SM120_SHARED_MEMORY_PER_BLOCK`` / the family table.

Data that runs inside SGLang (``patches/``, ``kernels/``) keeps its own copies and is not scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT

from sm120kit.hardware import arch

PACKAGE = REPO_ROOT / "sm120kit"
HARDWARE = PACKAGE / "hardware"

# kernel/nvcc_launcher.py runs as a stand-alone file inside a kernel build, with the standard library only, so
# it cannot import hardware/ (docs/design.md, "Where the tree differs from the target layout").
EXEMPT = {PACKAGE / "kernel" / "nvcc_launcher.py": "stand-alone compiler wrapper, standard library only"}

SHARED_MEMORY = str(arch.SM120_SHARED_MEMORY_PER_BLOCK)
PATTERNS = {
    "the SM120 shared-memory figure": re.compile(r"(?<![0-9])" + SHARED_MEMORY + r"(?![0-9])"),
    "a capability-12 test": re.compile(
        r"\[\s*0\s*\]\s*(?:==|!=|>=|<=|>|<)\s*12\b"  # capability[0] == 12
        r"|\bmajor\s*(?:==|!=)\s*12\b"  # major == 12
        r"|//\s*10\s*(?:==|!=)\s*12\b"  # sm // 10 == 12
        r"|(?:==|!=)\s*\(\s*12\s*,"  # capability == (12, 0)
        r"|\bin\s*\(\s*\(\s*12\s*,"  # capability in ((12, 0), ...)
        r"|\bin\s*\(\s*(?:\d+\s*,\s*)*12\s*(?:,\s*\d+\s*)*\)"  # capability[0] in (10, 12)
    ),
}


def offences(files, base: Path = REPO_ROOT) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in PATTERNS.items():
                if pattern.search(line):
                    found.append(f"{Path(path).relative_to(base)}:{number}: {what}: {line.strip()}")
    return found


def _package_files():
    return [
        p
        for p in sorted(PACKAGE.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".toml", ".md") and HARDWARE not in p.parents and p not in EXEMPT
    ]


def test_no_hardware_fact_outside_the_hardware_package():
    assert offences(_package_files()) == []


def test_the_scan_finds_each_kind_of_offence(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "if torch.cuda.get_device_capability()[0] == 12:\n    limit = 101376\n"
        "sm12x = major == 12\nok = cap == (12, 0)\nsm = number // 10 == 12\n"
        "fp4 = cap[0] not in (10, 12)\nfine = 1013760 + 12\n",
        encoding="utf-8",
    )
    found = offences([bad], base=tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5", "6"], found


def test_the_hardware_module_answers_what_the_callers_ask():
    assert arch.is_sm12x((12, 0)) and arch.is_sm12x((12, 1)) and not arch.is_sm12x((10, 0))
    assert arch.SM12X_LABELS == ("12.0", "12.1") and arch.SM12X_CAPABILITIES == ((12, 0), (12, 1))
    assert arch.has_block_scaled_fp4((12, 1)) and arch.has_block_scaled_fp4((10, 0))
    assert not arch.has_block_scaled_fp4((9, 0))
    assert arch.family((12, 0)).shared_memory_per_block == arch.SM120_SHARED_MEMORY_PER_BLOCK == 101376
