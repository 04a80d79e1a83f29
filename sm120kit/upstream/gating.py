"""A planned backend gate against the tree it goes into: would it refuse a backend role the tree runs on 12.x?

The ``sm120-backend-gating`` patch adds ``sglang/srt/sm12x_backend_gate.py``. Its variants read which
``trtllm_mha`` roles run on 12.x from the tree (``trtllm_mha_runs``); a variant that fixes them instead
(``TRTLLM_MHA_PREFILL_OK = False``, as every variant did before upstream commit 5d12280ae7 put an SM120
prefill path on main) is checked here against the facts read from the target
(:mod:`sm120kit.sglang.sm12x_paths`). A fixed value that disagrees with the tree is a warning of
``check-upstream``: ``False`` where the tree runs the role refuses a working backend, ``True`` where it does
not lets a backend through that fails later.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sm120kit.sglang import sm12x_paths

GATE_FILE = "sglang/srt/sm12x_backend_gate.py"
FIXED_NAMES = {("trtllm_mha", "prefill"): "TRTLLM_MHA_PREFILL_OK", ("trtllm_mha", "decode"): "TRTLLM_MHA_DECODE_OK"}
_MAX_GATE_BYTES = 1 << 20


def fixed_roles(gate_text: str) -> dict[tuple[str, str], bool]:
    """The roles a gate module fixes with a module-level ``NAME = True/False``; a role it computes (or a text
    that does not parse) is not listed."""
    if len(gate_text) > _MAX_GATE_BYTES:
        return {}
    try:
        tree = ast.parse(gate_text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    names = {name: key for key, name in FIXED_NAMES.items()}
    found: dict[tuple[str, str], bool] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in names
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, bool)
        ):
            found[names[node.targets[0].id]] = node.value.value
    return found


def mismatches(gate_text: str, root: Path) -> list[str]:
    """One warning per role the gate fixes differently from what the tree at ``root`` runs on 12.x."""
    fixed = fixed_roles(gate_text)
    if not fixed:
        return []
    runs = sm12x_paths.runs_on_12x(root)
    out = []
    for (backend, role), allowed in sorted(fixed.items()):
        path = sm12x_paths.path_for(backend, role)
        name = FIXED_NAMES[(backend, role)]
        if runs[(backend, role)] and not allowed:
            out.append(
                f"the gate would refuse {backend} for {role} on 12.x ({name} = False), but this tree runs "
                f"it there ({path.describe()}: {path.source}); the patch would disable a working backend: "
                "use a variant that reads the tree, or refresh the patch"
            )
        elif allowed and not runs[(backend, role)]:
            out.append(
                f"the gate would let {backend} through for {role} on 12.x ({name} = True), but this tree "
                f"has no 12.x path for it (nothing in {path.file} {path.what})"
            )
    return out


def gate_text(new_files: dict[str, bytes | None], root: Path, applied: bool) -> str | None:
    """The gate module a patch plan writes (``new_files``), or the one already in the tree when the patch
    is applied there; ``None`` when neither holds one."""
    data = new_files.get(GATE_FILE)
    if data is None and applied:
        path = Path(root) / GATE_FILE
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()[:_MAX_GATE_BYTES]
            except OSError:
                data = None
    return None if data is None else data.decode("utf-8", "replace")
