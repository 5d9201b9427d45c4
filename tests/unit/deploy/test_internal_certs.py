"""deploy/scripts/internal_certs.py, the compose mTLS stack's one-shot certificate maker, run as its container runs
it: the certificates chain to the CA and carry the compose names and usages; a second run keeps every file; a
leaf near expiry, a missing file, a changed usage or a lost CA are issued again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy/scripts/internal_certs.py"
COMPOSE_LEAVES = ("gateway:client", "scheduler:server+client", "gpu-worker:server")


def run(tmp_path: Path, *args: str, leaves: tuple[str, ...] = COMPOSE_LEAVES) -> dict[str, str]:
    done = subprocess.run([sys.executable, str(SCRIPT), "--ca-dir", str(tmp_path / "ca"), "--out",
                           str(tmp_path / "out"), *args, *leaves], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(line.removeprefix("internal-certs: ").split(": ") for line in done.stdout.splitlines())


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def snapshot(tmp_path: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(tmp_path)): (p.read_bytes(), p.stat().st_ino) for p in sorted(tmp_path.rglob("*"))
            if p.is_file()}


def test_issues_a_ca_and_each_services_certificate_for_its_compose_name(tmp_path):
    assert run(tmp_path) == {"ca": "issued", "gateway": "issued", "scheduler": "issued", "gpu-worker": "issued"}
    ca = cert(tmp_path / "ca/ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    expected = {"gateway": ({ExtendedKeyUsageOID.CLIENT_AUTH}, None),
                "scheduler": ({ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}, ["scheduler"]),
                "gpu-worker": ({ExtendedKeyUsageOID.SERVER_AUTH}, ["gpu-worker"])}
    for name, (usages, dns) in expected.items():
        folder = tmp_path / "out" / name
        assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        assert (folder / "ca.crt").read_bytes() == (tmp_path / "ca/ca.crt").read_bytes()
        leaf = cert(folder / "tls.crt")
        leaf.verify_directly_issued_by(ca)
        assert set(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == usages
        if dns is None:
            with pytest.raises(x509.ExtensionNotFound):
                leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        else:
            assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName) == dns
        assert (folder / "tls.key").stat().st_mode & 0o777 == 0o640
    assert not (tmp_path / "out/ca.key").exists() and (tmp_path / "ca/ca.key").stat().st_mode & 0o777 == 0o600


def test_a_second_run_keeps_every_file(tmp_path):
    run(tmp_path)
    before = snapshot(tmp_path)
    assert set(run(tmp_path).values()) == {"kept"}
    assert snapshot(tmp_path) == before  # same bytes and inodes: nothing rewritten, so no service reloads


def test_a_leaf_near_expiry_is_reissued_and_the_others_kept(tmp_path):
    run(tmp_path, "--days", "20", "--renew-days", "5", leaves=("gpu-worker:server",))
    run(tmp_path, leaves=("gateway:client",))
    old = cert(tmp_path / "out/gpu-worker/tls.crt")
    assert run(tmp_path) == {"ca": "kept", "gateway": "kept", "scheduler": "issued", "gpu-worker": "issued"}
    renewed = cert(tmp_path / "out/gpu-worker/tls.crt")
    assert renewed.serial_number != old.serial_number and renewed.not_valid_after_utc > old.not_valid_after_utc


def test_missing_or_mismatched_files_and_a_changed_usage_are_reissued(tmp_path):
    run(tmp_path)
    (tmp_path / "out/gateway/tls.key").unlink()
    scheduler_key = (tmp_path / "out/scheduler/tls.key").read_bytes()
    (tmp_path / "out/gpu-worker/tls.key").write_bytes(scheduler_key)  # a key of another certificate
    (tmp_path / "out/scheduler/ca.crt").write_text("stale")
    assert run(tmp_path, leaves=(*COMPOSE_LEAVES[:2], "gpu-worker:server+client")) == {
        "ca": "kept", "gateway": "issued", "scheduler": "kept", "gpu-worker": "issued"}
    assert (tmp_path / "out/scheduler/tls.key").read_bytes() == scheduler_key
    assert (tmp_path / "out/scheduler/ca.crt").read_bytes() == (tmp_path / "ca/ca.crt").read_bytes()
    assert ExtendedKeyUsageOID.CLIENT_AUTH in cert(tmp_path / "out/gpu-worker/tls.crt").extensions \
        .get_extension_for_class(x509.ExtendedKeyUsage).value


def test_a_lost_ca_reissues_every_leaf_under_the_new_one(tmp_path):
    run(tmp_path)
    (tmp_path / "ca/ca.key").unlink()
    assert set(run(tmp_path).values()) == {"issued"}
    ca = cert(tmp_path / "ca/ca.crt")
    for name in ("gateway", "scheduler", "gpu-worker"):
        cert(tmp_path / "out" / name / "tls.crt").verify_directly_issued_by(ca)
        assert (tmp_path / "out" / name / "ca.crt").read_bytes() == (tmp_path / "ca/ca.crt").read_bytes()


@pytest.mark.parametrize("bad", [("gateway:admin",), ("gateway",), ("../x:server",), ("--days", "10", "a:server")])
def test_bad_arguments_exit_2(tmp_path, bad):
    done = subprocess.run([sys.executable, str(SCRIPT), "--ca-dir", str(tmp_path / "ca"), "--out",
                           str(tmp_path / "out"), *bad], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and not (tmp_path / "ca").exists()
