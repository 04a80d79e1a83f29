"""The cubin cache of the MLA kernels' NVRTC module (kernels/sm120_attention/sm120_mla_nvrtc.py).

Real NVRTC compiles (the nvidia-cuda-nvrtc wheel; no GPU needed) of a small kernel, so each test takes well under
a second; the MLA source itself goes through the same function. What is checked: a second compile of the same
inputs reads the file the first wrote (NVRTC is not called again), any change of an input compiles anew, a torn
or altered file is compiled again and replaced, a cache folder that cannot be written only costs the compile,
and the variable turns the cache off.
"""

from __future__ import annotations

import os
import threading

import pytest

from sm120_attention import sm120_mla_nvrtc as nvrtc

SOURCE = 'extern "C" __global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }\n'

if nvrtc.nvrtc_library() is None:  # pragma: no cover - the test extras install nvidia-cuda-nvrtc
    pytest.skip("no NVRTC library", allow_module_level=True)


@pytest.fixture
def counted(monkeypatch):
    """Counts NVRTC compiles (the real ones still run)."""
    calls = []
    real = nvrtc._compile

    def compile_and_count(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(nvrtc, "_compile", compile_and_count)
    return calls


def cached_files(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".cubin"))


def test_a_second_compile_of_the_same_inputs_reads_the_cache(tmp_path, monkeypatch, counted):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    first = nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a", ("--std=c++17",))
    assert first.startswith(b"\x7fELF") and counted == ["sm_120a"]
    assert len(cached_files(tmp_path)) == 1
    again = nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a", ("--std=c++17",))
    assert again == first and counted == ["sm_120a"]  # NVRTC was not called again
    # Every input is part of the key: the target, an option, the source text, the program name.
    nvrtc.compile_cubin(SOURCE, "add.cu", "sm_121a", ("--std=c++17",))
    nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a", ("--std=c++17", "-DX=1"))
    nvrtc.compile_cubin(SOURCE.replace("1.0f", "2.0f"), "add.cu", "sm_120a", ("--std=c++17",))
    nvrtc.compile_cubin(SOURCE, "other.cu", "sm_120a", ("--std=c++17",))
    assert len(counted) == 5 and len(cached_files(tmp_path)) == 5
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate", "empty", "not ours"])
def test_a_damaged_file_is_compiled_again_and_replaced(tmp_path, monkeypatch, counted, damage):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    good = nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")
    (name,) = cached_files(tmp_path)
    path = tmp_path / name
    data = path.read_bytes()
    damaged = {
        "flip a payload byte": data[:-1] + bytes([data[-1] ^ 0xFF]),
        "truncate": data[: len(data) // 2],
        "empty": b"",
        "not ours": good,  # a bare cubin, without the header that holds its digest
    }[damage]
    path.write_bytes(damaged)
    assert nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a") == good
    assert len(counted) == 2 and path.read_bytes() == data


def test_a_link_or_a_folder_in_place_of_the_file_is_not_read(tmp_path, monkeypatch, counted):
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path / "cache"))
    good = nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")
    (name,) = cached_files(tmp_path / "cache")
    path = tmp_path / "cache" / name
    outside = tmp_path / "outside.cubin"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)
    assert nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a") == good
    assert len(counted) == 2 and not path.is_symlink()  # replaced by a plain file; the link's target untouched
    assert outside.read_bytes() == path.read_bytes()


def test_an_unwritable_cache_folder_only_costs_the_compile(tmp_path, monkeypatch, counted):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(blocker / "cache"))
    first = nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")
    assert nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a") == first
    assert len(counted) == 2 and blocker.read_text() == "not a folder"


@pytest.mark.parametrize("value", ["", "0", "off"])
def test_the_variable_turns_the_cache_off(tmp_path, monkeypatch, counted, value):
    monkeypatch.setenv(nvrtc.CACHE_ENV, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert nvrtc.cache_dir() is None
    nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")
    nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")
    assert len(counted) == 2 and not list(tmp_path.iterdir())


def test_the_default_folder_is_in_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(nvrtc.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert nvrtc.cache_dir() == str(tmp_path / "sglang" / "sm120_mla")


def test_processes_that_start_together_compile_once(tmp_path, monkeypatch, counted):
    """Threads stand in for the ranks of a tensor-parallel server: the lock file is taken per open file, so
    two threads of one process wait for each other as two processes do."""
    monkeypatch.setenv(nvrtc.CACHE_ENV, str(tmp_path))
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(nvrtc.compile_cubin(SOURCE, "add.cu", "sm_120a")))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1
    assert counted == ["sm_120a"]
