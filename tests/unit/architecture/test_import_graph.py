"""The import graph keeps the layers one way (gateway -> scheduler -> worker -> kernels; shared/ imports no service)
and has no cycle. Every import counts: module level, inside functions, and under `if TYPE_CHECKING:` (a type that
crosses a layer is a dependency on it all the same)."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("services", "shared", "kernels", "benchmarks", "pagedserve")


# The top-level folders linked into pagedserve/ (pagedserve/services -> ../services): importable only as
# pagedserve.<folder>. A bare `import services.x` would load a second copy of every module it reaches.
LINKED = ("services", "shared", "kernels", "benchmarks")
# The offline API: pagedserve/ itself, without the folders linked into it.
API = "pagedserve (the offline API)"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = ("pagedserve", *parts) if parts[0] in LINKED else parts
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
    ("pagedserve.shared", ("pagedserve.services", "pagedserve.benchmarks", API)),
    ("pagedserve.kernels", ("pagedserve.services", "pagedserve.benchmarks", API)),
    ("pagedserve.services.proto_convert",
     ("pagedserve.services.scheduler", "pagedserve.services.gateway", "pagedserve.services.gpu_worker")),
    ("pagedserve.services.gateway", ("pagedserve.services.scheduler", "pagedserve.services.gpu_worker")),
    ("pagedserve.services.scheduler", ("pagedserve.services.gateway", "pagedserve.services.gpu_worker")),
    ("pagedserve.services.gpu_worker", ("pagedserve.services.gateway", "pagedserve.services.scheduler")),
]


def under(module: str, prefix: str) -> bool:
    if prefix == API:
        return module == "pagedserve" or (under(module, "pagedserve") and module.split(".")[1] not in LINKED)
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


# Where project code lives besides the packages: every .py file here is checked for bare names too.
SCANNED = (*PACKAGES, "tests", "tools", "deploy")
BARE_NAME = re.compile("(" + "|".join(LINKED) + r")(\.\w+)+")


def names_a_module(dotted: str) -> bool:
    """`services.<name>...` names a module when services/<name>(.py) exists (not `services.items`)."""
    folder, child = dotted.split(".")[:2]
    return (ROOT / folder / child).is_dir() or (ROOT / folder / f"{child}.py").is_file()


def bare_references(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each import of a linked folder by its bare name, and of each string constant that names one
    of its modules (`-m services.<module>`, monkeypatch targets, logger names)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and BARE_NAME.fullmatch(node.value):
            names = [node.value] if names_a_module(node.value) else []
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in LINKED]
    return sorted(found)


def test_no_code_imports_a_linked_folder_by_its_bare_name() -> None:
    files = [p for folder in SCANNED for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 300, f"found only {len(files)} files"
    bare = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in files for line, name in bare_references(path)]
    assert not bare, "import these as pagedserve.<folder>:\n" + "\n".join(bare)


def test_the_bare_name_check_sees_imports_and_module_strings(tmp_path: Path) -> None:
    services, shared = LINKED[:2]  # spelled out, this test's own strings would be bare names
    sample = tmp_path / "sample.py"
    sample.write_text(f"import {services}.cli\nfrom {shared} import sampling_params\n"
                      f"from pagedserve.kernels import cpu\n"
                      f"ARGV = ['-m', '{services}.gateway']\nNOT_A_MODULE = '{services}.items'\n")
    assert bare_references(sample) == [(1, f"{services}.cli"), (2, shared), (4, f"{services}.gateway")]
