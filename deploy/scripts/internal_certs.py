"""Make the private CA and the per-service certificates of the internal mutual TLS, once: the one-shot
`internal-certs` container of deploy/compose.mtls.yml runs it before the services start (Kubernetes has
cert-manager for this: deploy/k8s/components/internal-mtls).

Usage: python deploy/scripts/internal_certs.py --ca-dir DIR --out DIR [--owner UID] NAME:USAGE ...

Each NAME:USAGE (USAGE `server`, `client` or `server+client`) gets OUT/NAME/tls.crt, tls.key and the CA's ca.crt,
the layout of a cert-manager Secret, which the services' --internal-tls-cert/-key/-ca read. A server certificate
names NAME (a DNS subject alternative name: the compose service name its clients dial). The CA (ca.key, ca.crt)
stays in --ca-dir, which only this script mounts. Keys are ECDSA P-256; the CA lives 10 years, leaves --days.

Contract: idempotent. Files that are complete, signed by the current CA, carry the asked name and usage, match
their key and stay valid longer than --renew-days are kept (a restart changes nothing, and the services, which
reread their files when they change, see nothing); anything missing, broken or near expiry is issued again, and a
new CA (none, unreadable, or under a leaf's lifetime from its end) reissues every leaf. Each file is replaced
atomically (a temporary file renamed). With --owner, the service files belong to that uid (group: this process's),
keys mode 0640, so a root container can hand them to the services' non-root user and still read them next time.
Exit 0 with one line per certificate (kept / issued), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "pagedserve-internal-ca"
CA_DAYS = 3650
USAGES = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}


@dataclass(frozen=True)
class Leaf:
    """One service's certificate: its folder name, and whether it serves and/or dials."""

    name: str
    usages: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Leaf:
        name, _, usage = text.partition(":")
        usages = tuple(sorted(set(usage.split("+"))))
        if not name or "/" in name or name.startswith(".") or not usages or not set(usages) <= set(USAGES):
            raise ValueError(f"{text!r}: expected NAME:server, NAME:client or NAME:server+client")
        return cls(name, usages)

    @property
    def dns_names(self) -> list[str]:
        return [self.name] if "server" in self.usages else []


@dataclass
class Authority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_atomically(path: Path, data: bytes, mode: int, owner: int | None = None) -> None:
    """`path` holds `data` (mode, owner) or its old content, never a part: a temporary file renamed over it."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(handle, mode)
        if owner is not None:
            os.fchown(handle, owner, os.getegid())
        os.write(handle, data)
        os.fsync(handle)
    finally:
        os.close(handle)
    os.replace(temporary, path)


def _builder(subject: str, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    start = now()
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(start - datetime.timedelta(minutes=5))
            .not_valid_after(start + datetime.timedelta(days=days)))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load(folder: Path, key_name: str, cert_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    """The key and certificate there when both parse and belong together; None otherwise."""
    try:
        key = serialization.load_pem_private_key((folder / key_name).read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate((folder / cert_name).read_bytes())
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return None
    return key, cert


def _remaining_days(cert: x509.Certificate) -> float:
    return (cert.not_valid_after_utc - now()).total_seconds() / 86400


def ensure_authority(ca_dir: Path, min_days: float) -> tuple[Authority, bool]:
    """(the CA, whether it was made now): the one in ca_dir when valid for over `min_days`, else a new one."""
    found = _load(ca_dir, "ca.key", "ca.crt")
    if found is not None:
        key, cert = found
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value \
            if any(e.oid == x509.BasicConstraints.oid for e in cert.extensions) else None
        if constraints is not None and constraints.ca and _remaining_days(cert) > min_days:
            return Authority(key, cert), False
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (_builder(CA_NAME, subject, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    ca_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(ca_dir / "ca.key", _key_pem(key), 0o600)
    write_atomically(ca_dir / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return Authority(key, cert), True


def leaf_is_current(folder: Path, leaf: Leaf, authority: Authority, renew_days: float) -> bool:
    """Whether folder holds a key and certificate for `leaf`, signed by `authority`, valid beyond renew_days."""
    found = _load(folder, "tls.key", "tls.crt")
    if found is None:
        return False
    cert = found[1]
    try:
        cert.verify_directly_issued_by(authority.cert)
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName) if leaf.dns_names else []
    except (InvalidSignature, ValueError, TypeError, x509.ExtensionNotFound):
        return False
    return usages == {USAGES[u] for u in leaf.usages} and names == leaf.dns_names and \
        _remaining_days(cert) > renew_days


def issue(folder: Path, leaf: Leaf, authority: Authority, days: int, owner: int | None) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(leaf.name, authority.cert.subject, key.public_key(), days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([USAGES[u] for u in leaf.usages]), critical=False))
    if leaf.dns_names:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in leaf.dns_names]),
                                        critical=False)
    cert = builder.sign(authority.key, hashes.SHA256())
    write_atomically(folder / "tls.key", _key_pem(key), 0o640, owner)
    write_atomically(folder / "tls.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644, owner)


def ensure(ca_dir: Path, out: Path, leaves: list[Leaf], days: int, renew_days: float,
           owner: int | None = None) -> dict[str, str]:
    """Every leaf's files current under `out` (and the CA's ca.crt beside each); name -> "kept" or "issued"."""
    authority, new_ca = ensure_authority(ca_dir, min_days=days)
    done = {"ca": "issued" if new_ca else "kept"}
    for leaf in leaves:
        folder = out / leaf.name
        folder.mkdir(parents=True, exist_ok=True)
        current = leaf_is_current(folder, leaf, authority, renew_days)
        if not current:
            issue(folder, leaf, authority, days, owner)
        ca_file = folder / "ca.crt"
        if not ca_file.is_file() or ca_file.read_bytes() != authority.pem:
            write_atomically(ca_file, authority.pem, 0o644, owner)
        done[leaf.name] = "kept" if current else "issued"
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="internal_certs.py", description=__doc__.splitlines()[0])
    parser.add_argument("leaves", nargs="+", metavar="NAME:USAGE", help="server, client or server+client")
    parser.add_argument("--ca-dir", type=Path, required=True, help="the CA's key and certificate (private)")
    parser.add_argument("--out", type=Path, required=True, help="OUT/NAME/{tls.crt,tls.key,ca.crt} per service")
    parser.add_argument("--owner", type=int, default=None, help="uid the service files are given to")
    parser.add_argument("--days", type=int, default=90, help="a leaf certificate's lifetime")
    parser.add_argument("--renew-days", type=float, default=30, help="reissue a leaf with less left than this")
    args = parser.parse_args(argv)
    try:
        leaves = [Leaf.parse(text) for text in args.leaves]
    except ValueError as exc:
        parser.error(str(exc))
    if args.renew_days >= args.days:
        parser.error(f"--renew-days {args.renew_days} must be under --days {args.days}")
    for name, what in ensure(args.ca_dir, args.out, leaves, args.days, args.renew_days, args.owner).items():
        print(f"internal-certs: {name}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
