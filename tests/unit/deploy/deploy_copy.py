"""A copy of the repository's deploy files, set up as an operator would (secrets.env from its example)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import REPO_ROOT

SECRETS = Path("deploy/k8s/base/secrets.env")


def copy_deploy_files(target: Path) -> Path:
    shutil.copytree(REPO_ROOT / "deploy", target / "deploy", ignore=shutil.ignore_patterns("secrets.env"))
    shutil.copy(REPO_ROOT / "docker-compose.yml", target / "docker-compose.yml")
    shutil.copy(target / SECRETS.with_suffix(".env.example"), target / SECRETS)
    return target
