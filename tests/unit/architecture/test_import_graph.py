"""The import graph keeps the layers one way (gateway -> scheduler -> worker -> kernels; shared/ imports no service)
and has no cycle. Every import counts: module level, inside functions, and under `if TYPE_CHECKING:` (a type that
crosses a layer is a dependency on it all the same)."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("services", "shared", "kernels", "benchmarks", "pagedserve")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str) -> set[str]:
    """Every module name the file imports, absolute (relative imports resolved against `module`)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (names that are not project modules are dropped)."""
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    assert len(files) > 100, f"found only {len(files)} modules under {ROOT}"
    return {module: {name for name in imported_names(path, module) if name in files and name != module}
            for module, path in files.items()}


GRAPH = project_graph()

# (importer prefix, forbidden prefixes)
RULES = [
    ("shared", ("services", "benchmarks", "pagedserve")),
    ("kernels", ("services", "benchmarks", "pagedserve")),
    ("services.proto_convert", ("services.scheduler", "services.gateway", "services.gpu_worker")),
    ("services.gateway", ("services.scheduler", "services.gpu_worker")),
    ("services.scheduler", ("services.gateway", "services.gpu_worker")),
    ("services.gpu_worker", ("services.gateway", "services.scheduler")),
]


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize(("importer", "forbidden"), RULES, ids=[rule[0] for rule in RULES])
def test_layer_imports_only_what_it_may(importer: str, forbidden: tuple[str, ...]) -> None:
    modules = [m for m in GRAPH if under(m, importer)]
    assert modules, f"no module under {importer}"
    breaches = sorted(f"{m} -> {target}" for m in modules for target in GRAPH[m]
                      if any(under(target, prefix) for prefix in forbidden))
    assert not breaches, "layer breaches:\n" + "\n".join(breaches)


def test_no_import_cycle() -> None:
    try:
        tuple(graphlib.TopologicalSorter(GRAPH).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import cycle: " + " -> ".join(exc.args[1]))


def test_the_graph_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The parser itself: an import inside a function and a relative import are both found."""
    package = tmp_path / "pkg"
    package.mkdir()
    source = package / "mod.py"
    source.write_text("def f():\n    from shared.x import y\n\nfrom . import sibling\nfrom .other import z\n")
    names = imported_names(source, "pkg.mod")
    assert {"shared.x", "shared.x.y", "pkg", "pkg.sibling", "pkg.other", "pkg.other.z"} <= names
