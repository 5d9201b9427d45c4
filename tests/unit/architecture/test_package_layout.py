"""The package layout behind the one import name (docs/design/package-names.md): the top-level folders services/,
shared/, kernels/ and benchmarks/ are linked into pagedserve/ by relative symlinks and hold no `__init__.py`, so
that from a checkout a bare `import kernels` finds an installed regular package (Hugging Face's) before ours, and the
wheel is built from pagedserve* alone."""

from __future__ import annotations

import importlib.util
import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINKED = ("services", "shared", "kernels", "benchmarks")


@pytest.mark.parametrize("folder", LINKED)
def test_each_folder_is_linked_into_pagedserve(folder: str) -> None:
    link = ROOT / "pagedserve" / folder
    assert link.is_symlink(), f"pagedserve/{folder} should be a symlink to ../{folder}"
    assert os.readlink(link) == f"../{folder}", "a relative link survives clones, COPY and wheel builds"
    assert link.resolve() == (ROOT / folder).resolve()


@pytest.mark.parametrize("folder", LINKED)
def test_no_top_level_folder_is_a_regular_package(folder: str) -> None:
    """A regular package on sys.path (the checkout's root comes first) would shadow any installed one of its name;
    a namespace portion never does."""
    assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py makes `import {folder}` ours"


def test_the_wheel_builds_one_package_tree() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["include"] == ["pagedserve*"]
    assert set(setuptools["package-data"]) == {"pagedserve.kernels.cpu"}


def test_the_linked_packages_import_through_pagedserve() -> None:
    for folder in LINKED:
        spec = importlib.util.find_spec(f"pagedserve.{folder}")
        assert spec is not None and spec.submodule_search_locations is not None
        assert [Path(p).resolve() for p in spec.submodule_search_locations] == [(ROOT / folder).resolve()]
