"""C kernel builds are cached on disk by a hash of source, headers, flags, compiler and CPU: a second process (or
call) loads the library instead of compiling, and any change to what it depends on builds a new one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pagedserve.kernels.cpu.build as build


def test_a_cached_library_is_loaded_without_compiling(tmp_path: Path, monkeypatch) -> None:
    compiled = []
    real = build.compile_library
    monkeypatch.setattr(build, "compile_library", lambda *args: compiled.append(args[1]) or real(*args))
    first = build.cached_library("small_linear", tmp_path)
    second = build.cached_library("small_linear", tmp_path)
    assert first == second and first.is_file() and compiled == [first]
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


def test_the_key_follows_source_headers_and_flags(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    shutil.copytree(build.HERE, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    cc = build.compiler()
    key = build.build_key("small_linear", cc, build.FLAGS, folder)
    assert key == build.build_key("small_linear", cc, build.FLAGS, folder)
    assert key != build.build_key("small_linear", cc, (*build.FLAGS, "-DEXTRA"), folder)
    assert key != build.build_key("fused_ops", cc, build.FLAGS, folder)
    (folder / "vec.h").write_text((folder / "vec.h").read_text() + "\n/* changed */\n")
    assert key != build.build_key("small_linear", cc, build.FLAGS, folder)


def test_an_unwritable_cache_falls_back_to_a_private_build(tmp_path: Path, monkeypatch, caplog) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    build.load_kernel.cache_clear()
    try:
        library = build.load_kernel("small_linear", blocked / "kernels")
    finally:
        build.load_kernel.cache_clear()
    assert hasattr(library, "small_linear_f32")
    assert "kernel cache" in caplog.text and "unusable" in caplog.text
