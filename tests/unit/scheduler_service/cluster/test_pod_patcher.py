"""The pod patcher sends exactly one JSON merge patch of one annotation to the pod's own URL, with the service
account's current token, verifying an https API against the service account's CA; every failure is PatchFailed."""

from __future__ import annotations

import json
import ssl

import pytest
from cryptography import x509

from pagedserve.services.scheduler.cluster.deletion_cost import ANNOTATION
from pagedserve.services.scheduler.cluster.pod_patcher import PatchFailed, PodPatcher, PodRef, namespace_of
from tests.unit.scheduler_service.cluster.fake_kube_api import FakeKubeAPI
from tests.unit.shared.test_internal_tls import Authority


def service_account(folder, token: str = "token-1", namespace: str = "pagedserve"):
    folder.mkdir(exist_ok=True)
    (folder / "token").write_text(token + "\n")
    (folder / "namespace").write_text(namespace)
    return folder


@pytest.mark.asyncio
async def test_the_patch_is_a_merge_patch_of_one_annotation_with_the_current_token(tmp_path):
    api = FakeKubeAPI()
    await api.start()
    try:
        folder = service_account(tmp_path / "sa")
        patcher = PodPatcher(f"http://127.0.0.1:{api.port}", str(folder), PodRef(namespace_of(str(folder)),
                                                                                  "engine-7d9f-x2k"))
        await patcher.set_annotation(ANNOTATION, "300")
        (folder / "token").write_text("token-2")  # kubelet rotated it
        await patcher.set_annotation(ANNOTATION, "0")
    finally:
        await api.stop()
    first, second = api.requests
    assert (first.method, first.path) == ("PATCH", "/api/v1/namespaces/pagedserve/pods/engine-7d9f-x2k")
    assert first.headers["Content-Type"] == "application/merge-patch+json"
    assert first.headers["Authorization"] == "Bearer token-1"
    assert json.loads(first.body) == {"metadata": {"annotations": {
        "controller.kubernetes.io/pod-deletion-cost": "300"}}}
    assert second.headers["Authorization"] == "Bearer token-2"
    assert json.loads(second.body)["metadata"]["annotations"][ANNOTATION] == "0"


@pytest.mark.asyncio
async def test_an_https_api_is_verified_against_the_service_account_ca(tmp_path):
    authority = Authority.create(tmp_path / "ca", "kube-ca")
    server = authority.issue("apiserver", "localhost", x509.oid.ExtendedKeyUsageOID.SERVER_AUTH)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(server / "tls.crt", server / "tls.key")
    api = FakeKubeAPI()
    await api.start(context)
    try:
        trusting = service_account(tmp_path / "sa")
        (trusting / "ca.crt").write_bytes((tmp_path / "ca/ca.crt").read_bytes())
        await PodPatcher(f"https://localhost:{api.port}", str(trusting), PodRef("ns", "pod")).set_annotation("a", "1")
        assert len(api.requests) == 1
        Authority.create(tmp_path / "other-ca", "someone-else")
        (trusting / "ca.crt").write_bytes((tmp_path / "other-ca/ca.crt").read_bytes())
        with pytest.raises(PatchFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await PodPatcher(f"https://localhost:{api.port}", str(trusting), PodRef("ns", "pod")).set_annotation(
                "a", "1")
        assert len(api.requests) == 1  # the untrusted server never saw the patch
    finally:
        await api.stop()


@pytest.mark.asyncio
async def test_refusals_missing_files_and_no_server_are_patch_failed(tmp_path):
    api = FakeKubeAPI(statuses=[403])
    await api.start()
    folder = service_account(tmp_path / "sa")
    try:
        with pytest.raises(PatchFailed, match="HTTP 403"):
            await PodPatcher(f"http://127.0.0.1:{api.port}", str(folder), PodRef("ns", "pod")).set_annotation("a", "1")
        (folder / "token").unlink()
        with pytest.raises(PatchFailed, match="no service account token"):
            await PodPatcher(f"http://127.0.0.1:{api.port}", str(folder), PodRef("ns", "pod")).set_annotation("a", "1")
        assert len(api.requests) == 1
    finally:
        await api.stop()
    with pytest.raises(PatchFailed, match="ConnectError"):
        await PodPatcher(f"http://127.0.0.1:{api.port}", str(service_account(folder)), PodRef("ns", "pod"),
                         timeout_s=5).set_annotation("a", "1")
    with pytest.raises(PatchFailed, match="no pod namespace"):
        namespace_of(str(tmp_path / "missing"))
