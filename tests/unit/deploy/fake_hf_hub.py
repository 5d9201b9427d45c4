"""A fake Hugging Face hub for the fetch-model tests: a folder of repositories (ORG/NAME/...) served on 127.0.0.1
through the four endpoints huggingface_hub's HfFileSystem uses (repo info, revision info, tree listing, file
resolve). Repositories named in `gated` answer 401 unless the request carries `Authorization: Bearer <token>`.
Every request path is recorded, with the Authorization header it carried."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    root: Path
    token: str = "hf_fake_token"
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, Authorization header)

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                hub.requests.append((self.path, self.headers.get("Authorization", "")))
                status, headers, body = hub.answer(unquote(urlparse(self.path).path), self.path,
                                                   self.headers.get("Authorization", ""))
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, raw: str, authorization: str) -> tuple[int, dict, bytes]:
        parts = path.strip("/").split("/")
        api = parts[:2] == ["api", "models"]
        repo = "/".join(parts[2:4] if api else parts[:2])
        folder = self.root / repo
        if not folder.is_dir():
            return _json({"error": "Repository not found"}, 404)
        if repo in self.gated and authorization != f"Bearer {self.token}":
            return _json({"error": "Access to this repository is restricted"}, 401)
        if api:
            return self._api(folder, repo, parts[4:], "recursive=true" in raw.lower())
        if len(parts) > 4 and parts[2] == "resolve":
            file = folder.joinpath(*parts[4:])
            if not file.is_file():
                return _json({"error": "Entry not found"}, 404)
            body = file.read_bytes()
            return 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}, body
        return _json({"error": "not served by the fake hub"}, 404)

    def _api(self, folder: Path, repo: str, rest: list[str], recursive: bool) -> tuple[int, dict, bytes]:
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        if not rest or rest[0] == "revision":
            return _json({"id": repo, "sha": COMMIT,
                          "siblings": [{"rfilename": str(p.relative_to(folder))} for p in files]})
        if rest[0] == "tree":
            below = folder.joinpath(*rest[2:])
            entries = sorted(below.rglob("*") if recursive else below.iterdir())
            return _json([{"type": "file" if p.is_file() else "directory", "path": str(p.relative_to(folder)),
                           "size": p.stat().st_size if p.is_file() else 0, "oid": "1" * 40} for p in entries])
        return _json({"error": "not served by the fake hub"}, 404)


def _json(obj, status: int = 200) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()
