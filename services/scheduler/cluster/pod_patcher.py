"""Sets one annotation of one pod through the Kubernetes API, as the pod's own service account.

Contract: one JSON merge patch, `PATCH {api}/api/v1/namespaces/{namespace}/pods/{name}` with Content-Type
`application/merge-patch+json` and body {"metadata": {"annotations": {key: value}}} (only that key changes),
authenticated by `Authorization: Bearer <token>`. The token (kubelet rotates projected tokens) and, for an https
API, the CA bundle `ca.crt` are read from the service account folder at every call. Any failure (no token,
connection, timeout, a non-2xx answer) raises PatchFailed naming it; nothing is retried here (the caller owns the
backoff).
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx

MERGE_PATCH = "application/merge-patch+json"


class PatchFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str

    def path(self) -> str:
        return f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods/{quote(self.name, safe='')}"


def namespace_of(service_account_dir: str) -> str:
    """The namespace the service account's files name (its `namespace` file); PatchFailed when unreadable."""
    try:
        return (Path(service_account_dir) / "namespace").read_text().strip()
    except OSError as exc:
        raise PatchFailed(f"no pod namespace: {exc}") from None


@dataclass(frozen=True)
class PodPatcher:
    api_url: str  # e.g. https://kubernetes.default.svc
    service_account_dir: str
    pod: PodRef
    timeout_s: float = 10.0

    async def set_annotation(self, key: str, value: str) -> None:
        headers = {"Authorization": f"Bearer {self._token()}", "Content-Type": MERGE_PATCH,
                   "Accept": "application/json"}
        body = json.dumps({"metadata": {"annotations": {key: value}}})
        url = self.api_url.rstrip("/") + self.pod.path()
        try:
            async with httpx.AsyncClient(verify=self._verify(), timeout=self.timeout_s, trust_env=False) as client:
                response = await client.patch(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise PatchFailed(f"PATCH {url}: {type(exc).__name__}: {exc}") from None
        if not response.is_success:
            raise PatchFailed(f"PATCH {url}: HTTP {response.status_code}: {response.text[:300]}")

    def _token(self) -> str:
        try:
            token = (Path(self.service_account_dir) / "token").read_text().strip()
        except OSError as exc:
            raise PatchFailed(f"no service account token: {exc}") from None
        if not token:
            raise PatchFailed(f"empty service account token in {self.service_account_dir}")
        return token

    def _verify(self) -> ssl.SSLContext | bool:
        if not self.api_url.startswith("https:"):
            return True  # plain http (tests, a local proxy): nothing to verify
        ca = Path(self.service_account_dir) / "ca.crt"
        try:
            return ssl.create_default_context(cafile=str(ca))
        except (OSError, ssl.SSLError) as exc:
            raise PatchFailed(f"cannot read the API server's CA {ca}: {exc}") from None
