"""Certificates made in the test: a CA, a server certificate for 127.0.0.1 and localhost, and a
client certificate, written as PEM files (the ``cryptography`` package; nothing is fetched)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    """PEM files: ``ca``; ``server_cert``/``server_key``; ``client_cert``/``client_key``;
    ``other_ca`` (a CA nobody trusts) with ``rogue_cert``/``rogue_key`` it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    rogue_cert: Path
    rogue_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _builder(subject: str, issuer: x509.Name, key) -> x509.CertificateBuilder:  # noqa: ANN001
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(name: str, folder: Path):  # noqa: ANN202
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(name, _name(name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert, _write_cert(cert, folder / f"{name}.pem")


def _leaf(name: str, ca_key, ca_cert, usage, folder: Path, sans=None):  # noqa: ANN001, ANN202
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(name, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _write_cert(cert, folder / f"{name}.pem"), _write_key(key, folder / f"{name}.key")


def make_certs(folder: Path) -> Certs:
    """Write a CA, a server and a client certificate (and an untrusted pair) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert, ca_path = _ca("test-ca", folder)
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _leaf("server", ca_key, ca_cert, ExtendedKeyUsageOID.SERVER_AUTH, folder, sans)
    client = _leaf("client", ca_key, ca_cert, ExtendedKeyUsageOID.CLIENT_AUTH, folder)
    other_key, other_cert, other_path = _ca("other-ca", folder)
    rogue = _leaf("rogue", other_key, other_cert, ExtendedKeyUsageOID.CLIENT_AUTH, folder)
    return Certs(ca_path, *server, *client, other_path, *rogue)
