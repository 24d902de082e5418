"""The control plane's certificates and service-account keys, made once per data folder.

One CA signs the API server's serving certificate (for the loopback names it answers on) and a
client certificate per identity. The admin is in `system:masters`; the controller manager and the
scheduler sign in under their own names, so that RBAC treats them as a real cluster would.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = dt.timedelta(days=365)

# name -> (common name, organisation): the identities the apiserver knows from their certificates.
CLIENTS = {
    "admin": ("gantry-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
}


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def serving(self) -> tuple[Path, Path]:
        return self.folder / "apiserver.crt", self.folder / "apiserver.key"

    def client(self, name: str) -> tuple[Path, Path]:
        return self.folder / f"{name}.crt", self.folder / f"{name}.key"

    @property
    def service_account(self) -> tuple[Path, Path]:
        return self.folder / "sa.pub", self.folder / "sa.key"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common: str, organisation: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if organisation:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(parts)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(path: Path, certificate: x509.Certificate) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def ensure(folder: Path) -> Pki:
    """Make what is missing; an existing set is kept (a restart keeps its tokens valid)."""
    pki = Pki(folder)
    if pki.ca.exists() and pki.service_account[1].exists():
        return pki
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("gantry-dev-ca")
    _pem(pki.ca, _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True))
    _write_key(folder / "ca.key", ca_key)

    serving_key = _key()
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),  # the service range's first address
    ]
    cert = _sign(
        _name("kube-apiserver"),
        serving_key.public_key(),
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        names=names,
    )
    _pem(pki.serving[0], cert)
    _write_key(pki.serving[1], serving_key)

    for name, (common, organisation) in CLIENTS.items():
        key = _key()
        cert = _sign(
            _name(common, organisation),
            key.public_key(),
            ca_name,
            ca_key,
            usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        _pem(pki.client(name)[0], cert)
        _write_key(pki.client(name)[1], key)

    # Service-account tokens are signed with RSA, which every consumer accepts.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account[1], sa_key)
    pki.service_account[0].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
