"""The one parser of architecture names (sm120kit.hardware.arch.parse_arch) and its users."""

from __future__ import annotations

import pytest

from sm120kit.cli import main
from sm120kit.errors import UsageError
from sm120kit.hardware import arch


@pytest.mark.parametrize(
    "text, capability, variant, prefix",
    [
        ("12.0", (12, 0), "", ""),
        ("12.0a", (12, 0), "a", ""),
        ("12.1f", (12, 1), "f", ""),
        ("sm_120a", (12, 0), "a", "sm"),
        ("120", (12, 0), "", ""),
        ("compute_120a", (12, 0), "a", "compute"),
        (" SM_121A ", (12, 1), "a", "sm"),
        ("90a", (9, 0), "a", ""),
        ("sm_75", (7, 5), "", "sm"),
    ],
)
def test_accepted_forms(text, capability, variant, prefix):
    parsed = arch.parse_arch(text)
    assert (parsed.capability, parsed.variant, parsed.prefix) == (capability, variant, prefix)
    assert arch.parse_capability(text) == capability


@pytest.mark.parametrize("bad", ["99", "12.7", "sm_12", "", "blackwell", "sm_", "9", "12.0+PTX", "gfx1201"])
def test_bad_values_are_refused(bad):
    with pytest.raises(arch.NotAnArch) as info:
        arch.parse_arch(bad)
    # A ValueError; the command line turns it into its UsageError (exit 2), which keeps its own exit code.
    assert isinstance(info.value, ValueError) and not isinstance(info.value, UsageError)
    assert repr(bad) in info.value.message and "sm_120a" in info.value.message and "12.1" in info.value.message


def test_unknown_targets_pass_when_asked():
    assert arch.parse_arch("sm_130", known_only=False).capability == (13, 0)
    assert arch.parse_arch("9.0+PTX", allow_plus_ptx=True).plus_ptx


def test_every_user_parses_the_same():
    from sm120kit.kernel import build
    from sm120kit.verify import report

    assert build.parse_build_arch("sm_121a").sass == arch.parse_arch("sm_121a").sass == "sm_121a"
    assert report.parse_arch_entries("compute_120a")[0].capability == (12, 0)
    for bad in ("99", "12.7"):
        with pytest.raises(UsageError):
            build.parse_build_arch(bad)


def test_verify_refuses_unknown_arch(capsys):
    with pytest.raises(SystemExit) as info:
        main(["verify", "--arch", "99"])
    assert info.value.code == UsageError.exit_code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "'99'" in err and "9.9" in err and "sm_120a" in err


@pytest.mark.parametrize("machine, expected", [("x86_64", (13, 0)), ("aarch64", (12, 9)), ("arm64", (12, 9))])
def test_every_consumer_agrees_on_the_minimum_cuda_of_12_1(machine, expected):
    from sm120kit.kernel import build
    from sm120kit.verify import report

    assert arch.min_cuda((12, 1), machine=machine) == expected
    assert build.parse_build_arch("12.1a").min_cuda(machine) == expected
    assert report.min_tool_release((12, 1), machine) == expected


def test_minimum_cuda_of_the_other_targets():
    from sm120kit.kernel import build

    assert arch.min_cuda((12, 0), machine="x86_64") == build.parse_build_arch("12.0a").min_cuda("x86_64") == (12, 8)
    assert arch.min_cuda((12, 0), variant="f") == build.parse_build_arch("12.0f").min_cuda() == (12, 9)
    assert arch.min_cuda((13, 7)) is None
