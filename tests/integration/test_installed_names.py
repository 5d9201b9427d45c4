"""The installed distribution shadows nothing (issue 39): its wheel holds one top-level package, pagedserve, and in a
fresh venv that also has Hugging Face's `kernels` (transformers >= 5.25 needs it), `import kernels` is Hugging Face's
and `import pagedserve.kernels` is ours, from a neutral folder and from the repository root alike.

The wheel is built from a copy of what the image copies (deploy/docker/Dockerfile: pyproject.toml, README.md and the
package folders, links as links), so a link that only resolves in this checkout would fail here. The venv sees this
environment's site-packages through a .pth line (the dependencies, Hugging Face's `kernels` among them: the dev
extra installs it) but not its editable install of pagedserve (a .pth inside a .pth'd folder is not processed)."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE_COPIES = ("pyproject.toml", "README.md", "pagedserve", "services", "shared", "kernels", "benchmarks")
PROBE = """
import importlib.metadata, importlib.util, json, kernels, pagedserve.kernels
hub = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
print(json.dumps({"kernels": kernels.__file__, "hub": str(hub), "hub_api": hasattr(kernels, "get_kernel"),
                  "ours": list(pagedserve.kernels.__path__),
                  "build": importlib.util.find_spec("pagedserve.kernels.cpu.build").origin}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in IMAGE_COPIES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, timeout=600)
    [built] = out.glob("pagedserve-*.whl")
    return built


@pytest.fixture(scope="module")
def clean_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    [site_packages] = (env / "lib").glob("python3*/site-packages")
    (site_packages / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=600)
    return python


def probe(python: Path, cwd: Path) -> dict:
    done = subprocess.run([str(python), "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_wheel_holds_only_pagedserve(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"pagedserve", wheel.name.split("-py3")[0] + ".dist-info"}
    for module in ("services/cli.py", "shared/sampling_params.py", "kernels/cpu/vec.h", "benchmarks/cli.py",
                   "services/proto_gen/worker_pb2.pyi"):
        assert f"pagedserve/{module}" in names, f"{module} missing from the wheel"


@pytest.mark.parametrize("where", ["neutral", "repository"])
def test_hugging_face_kernels_and_ours_import_side_by_side(clean_python: Path, tmp_path: Path, where: str) -> None:
    found = probe(clean_python, tmp_path if where == "neutral" else ROOT)
    assert Path(found["kernels"]).resolve() == Path(found["hub"]).resolve(), f"`import kernels` gave {found}"
    assert found["hub_api"], "Hugging Face's kernels exports get_kernel"
    installed = clean_python.parent.parent
    ours = [Path(p) for p in found["ours"]]
    if where == "neutral":  # the wheel's copy; from the root, the checkout's pagedserve/ comes first on sys.path
        assert ours == [p for p in ours if p.is_relative_to(installed)] != []
        assert Path(found["build"]).is_relative_to(installed)
    else:
        assert [p.resolve() for p in ours] == [(ROOT / "kernels").resolve()]


def test_the_installed_command_runs(clean_python: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(clean_python.parent / "pagedserve"), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout
