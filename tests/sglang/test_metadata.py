"""The package metadata readers (sm120kit.sglang.metadata)."""

from __future__ import annotations

from sm120kit.sglang import metadata


def test_installed_version_takes_the_first_installed_name():
    assert metadata.installed_version("no-such-package-sm120kit") is None
    have = metadata.installed_version("packaging")
    assert have and metadata.installed_version("no-such-package-sm120kit", "packaging") == have


def test_version_in_file(tmp_path):
    (tmp_path / "version.py").write_text('__version__ = "0.5.2"\n')
    (tmp_path / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    (tmp_path / "dynamic.py").write_text("__version__ = compute()\n")
    assert metadata.version_in_file(tmp_path / "version.py") == "0.5.2"
    assert metadata.version_in_file(tmp_path / "_version.py") == "0.5.23"
    assert metadata.version_in_file(tmp_path / "dynamic.py") is None
    assert metadata.version_in_file(tmp_path / "missing.py") is None


def test_dist_metadata_and_stated_version(tmp_path):
    package = tmp_path / "sglang"
    package.mkdir()
    info = tmp_path / "sglang-0.5.8.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.8\nRequires-Dist: transformers==4.57.1\n\nlong description\n"
    )
    other = tmp_path / "torch-2.9.1.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Name: torch\nVersion: 2.9.1\n")
    assert metadata.dist_metadata_files(tmp_path, "sglang") == [info / "METADATA"]
    assert len(metadata.dist_metadata_files(tmp_path)) == 2
    headers = metadata.read_dist_metadata(info / "METADATA")
    assert headers["Version"] == "0.5.8" and headers.get_all("Requires-Dist") == ["transformers==4.57.1"]
    assert metadata.read_dist_metadata(tmp_path / "missing").get("Version") is None
    assert metadata.read_stated_version(package) == ("0.5.8", "sglang-0.5.8.dist-info/METADATA")
    (package / "version.py").write_text('__version__ = "0.5.9"\n')
    assert metadata.read_stated_version(package) == ("0.5.9", "sglang/version.py")
