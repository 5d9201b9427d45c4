"""deploy/scripts/fetch_model.py, the model init container's script, run as the container runs it against a fake
model hub: a directory served over HTTP on 127.0.0.1 by this test, and a fake Hugging Face hub (fake_hf_hub.py)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.unit.deploy.fake_hf_hub import FakeHub

SCRIPT = REPO_ROOT / "deploy/scripts/fetch_model.py"
MODEL_FILES = {"config.json": '{"model_type": "llama"}', "generation_config.json": "{}", "tokenizer.json": "{}",
               "tokenizer_config.json": "{}", "model-00001-of-00002.safetensors": "w1",
               "model-00002-of-00002.safetensors": "w2"}
LEFT_BEHIND = {"README.md": "# card", "pytorch_model.bin": "dup", "original/consolidated.00.pth": "dup"}


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hub(tmp_path):
    """(base URL, root folder) of an HTTP server over a folder holding org/model-a and org/no-config."""
    root = tmp_path / "hub"
    for name, text in {**MODEL_FILES, **LEFT_BEHIND}.items():
        path = root / "org/model-a" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "org/no-config").mkdir(parents=True)
    (root / "org/no-config/model.safetensors").write_text("w")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root, server
    server.shutdown()
    server.server_close()


def fetch(source: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), source, str(out), *flags], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT)


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def test_fetches_the_model_files_and_leaves_the_rest(hub, tmp_path):
    url, _, _ = hub
    out = tmp_path / "models/model-a"
    done = fetch(f"{url}/org/model-a/", out)
    assert done.returncode == 0, done.stderr
    assert files(out) == {**MODEL_FILES, ".source": f"{url}/org/model-a/\n"}
    assert [p.name for p in out.parent.iterdir()] == ["model-a"]  # no partial folder left


def test_a_fetched_folder_is_not_fetched_again(hub, tmp_path):
    url, _, server = hub
    out = tmp_path / "model-a"
    assert fetch(f"{url}/org/model-a/", out).returncode == 0
    server.shutdown()  # a restarted pod finds its volume filled and needs no network
    done = fetch(f"{url}/org/model-a/", out)
    assert done.returncode == 0, done.stderr
    assert "already fetched" in done.stdout


def test_tokenizer_only_skips_the_weights(hub, tmp_path):
    url, _, _ = hub
    out = tmp_path / "tokenizer"
    assert fetch(f"{url}/org/model-a/", out, "--tokenizer-only").returncode == 0
    assert set(files(out)) == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                               ".source"}


def test_another_source_replaces_the_folder(hub, tmp_path):
    url, root, _ = hub
    (root / "org/model-b").mkdir()
    for name in ("config.json", "model.safetensors"):
        (root / "org/model-b" / name).write_text("b")
    out = tmp_path / "model"
    assert fetch(f"{url}/org/model-a/", out).returncode == 0
    assert fetch(f"{url}/org/model-b/", out).returncode == 0
    assert set(files(out)) == {"config.json", "model.safetensors", ".source"}


@pytest.mark.parametrize("path, message", [("org/no-config/", "no config.json"), ("org/missing/", "fetch_model")])
def test_a_bad_source_fails_loudly_and_leaves_nothing(hub, tmp_path, path, message):
    url, _, _ = hub
    out = tmp_path / "models/model"
    done = fetch(f"{url}/{path}", out)
    assert done.returncode == 1
    assert message in done.stderr
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_local_folder_is_a_source(hub, tmp_path):
    _, root, _ = hub
    out = tmp_path / "model-a"
    done = fetch(str(root / "org/model-a"), out)
    assert done.returncode == 0, done.stderr
    assert set(files(out)) == set(MODEL_FILES) | {".source"}


@pytest.fixture
def hf_hub(tmp_path):
    """A fake Hugging Face hub holding org/model-a (public) and org/gated (needs the token)."""
    root = tmp_path / "hf"
    for repo in ("org/model-a", "org/gated"):
        for name, text in {**MODEL_FILES, **LEFT_BEHIND}.items():
            path = root / repo / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    hub = FakeHub(root, gated={"org/gated"})
    url = hub.start()
    yield url, hub
    hub.stop()


def fetch_hf(source: str, out: Path, endpoint: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(out.parent / "hf-home")}
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, str(SCRIPT), source, str(out)], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT, env=env)


def test_a_hugging_face_repo_is_fetched_without_its_duplicates(hf_hub, tmp_path):
    url, hub = hf_hub
    out = tmp_path / "models/model-a"
    done = fetch_hf("hf://org/model-a", out, url)
    assert done.returncode == 0, done.stderr
    assert files(out) == {**MODEL_FILES, ".source": "hf://org/model-a\n"}
    downloaded = {path.split("/resolve/main/", 1)[1] for path, _ in hub.requests if "/resolve/" in path}
    assert downloaded == set(MODEL_FILES)  # README, *.bin and original/ were never downloaded


def test_a_revision_is_fetched_at_that_revision(hf_hub, tmp_path):
    url, hub = hf_hub
    assert fetch_hf("hf://org/model-a@v1.0", tmp_path / "model-a", url).returncode == 0
    resolved = [path for path, _ in hub.requests if "/resolve/" in path]
    assert resolved and all("/resolve/v1.0/" in path for path in resolved)


def test_a_gated_repo_needs_the_hf_token_secret(hf_hub, tmp_path):
    url, hub = hf_hub
    refused = fetch_hf("hf://org/gated", tmp_path / "no-token/gated", url)
    assert refused.returncode == 1 and "fetch_model" in refused.stderr
    assert not (tmp_path / "no-token/gated").exists()
    done = fetch_hf("hf://org/gated", tmp_path / "token/gated", url, token=hub.token)
    assert done.returncode == 0, done.stderr
    assert set(files(tmp_path / "token/gated")) == set(MODEL_FILES) | {".source"}
    assert all(auth == f"Bearer {hub.token}" for path, auth in hub.requests[-len(MODEL_FILES):])
