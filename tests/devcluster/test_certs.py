"""devcluster's PKI: what the API server and its clients will be asked to trust (no build)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster import certs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.ensure(tmp_path_factory.mktemp("pki"))


def test_every_certificate_is_signed_by_the_ca(pki: certs.Pki) -> None:
    ca = load(pki.ca)
    leaves = [pki.serving[0], *(pki.client(name)[0] for name in certs.CLIENTS)]
    for path in leaves:
        load(path).verify_directly_issued_by(ca)  # raises on a bad signature or issuer
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_certificate_from_another_ca_does_not_verify(pki: certs.Pki, tmp_path: Path) -> None:
    stranger = certs.ensure(tmp_path / "other")
    with pytest.raises(InvalidSignature):
        load(stranger.client("admin")[0]).verify_directly_issued_by(load(pki.ca))


def test_the_admin_is_in_system_masters_and_the_components_are_not(pki: certs.Pki) -> None:
    def subject(name: str, oid: x509.ObjectIdentifier) -> list[str]:
        cert = load(pki.client(name)[0])
        return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]

    assert subject("admin", NameOID.ORGANIZATION_NAME) == ["system:masters"]
    assert subject("controller-manager", NameOID.COMMON_NAME) == ["system:kube-controller-manager"]
    assert subject("controller-manager", NameOID.ORGANIZATION_NAME) == []
    assert subject("scheduler", NameOID.COMMON_NAME) == ["system:kube-scheduler"]


def test_client_and_serving_certificates_have_their_usages(pki: certs.Pki) -> None:
    def usages(path: Path) -> list[x509.ObjectIdentifier]:
        return list(load(path).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    assert usages(pki.serving[0]) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert usages(pki.client("admin")[0]) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    names = load(pki.serving[0]).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "127.0.0.1" in [str(ip) for ip in names.value.get_values_for_type(x509.IPAddress)]


def test_keys_are_private_to_their_owner(pki: certs.Pki) -> None:
    for key in [pki.serving[1], pki.service_account[1], pki.client("admin")[1]]:
        assert key.stat().st_mode & 0o077 == 0


def test_ensure_keeps_an_existing_set(pki: certs.Pki) -> None:
    """A restart must keep the service-account key, or every issued token stops verifying."""
    before = pki.service_account[1].read_bytes(), pki.ca.read_bytes()
    certs.ensure(pki.folder)
    assert (pki.service_account[1].read_bytes(), pki.ca.read_bytes()) == before
