"""TLS from certificate files: server credentials for gRPC and uvicorn, client credentials.

Files are PEM. A server given ``client_ca`` requires every client to present a certificate
signed by it (mutual TLS). Files are read once at start; a missing or unreadable file stops the
server before it binds, naming the option.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tokenkeys.errors import ConfigError

PathLike = str | os.PathLike[str]


def _read(path: PathLike, option: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot read it: {exc}", field=option) from exc
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{option} {path}: not a PEM file (no -----BEGIN line)", field=option)
    return data


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate chain and key, and optionally the CA its clients must chain to."""

    cert: PathLike
    key: PathLike
    client_ca: PathLike | None = None

    def __post_init__(self) -> None:
        # Read now: a bad file is a start-up error, not a failure on the first connection.
        self.grpc_credentials()
        self.ssl_context()

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.client_ca is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``grpc.aio.Server.add_secure_port``."""
        chain = _read(self.cert, "--tls-cert")
        key = _read(self.key, "--tls-key")
        ca = _read(self.client_ca, "--tls-client-ca") if self.client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The server-side context the HTTP frontend uses (also checks the files match)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(self.cert), str(self.key))
            if self.client_ca is not None:
                context.load_verify_locations(str(self.client_ca))
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"--tls-cert {self.cert} / --tls-key {self.key}: {exc}", field="tls-cert"
            ) from exc
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """``uvicorn.Config`` arguments serving HTTPS with these files."""
        options: dict[str, Any] = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.client_ca is not None:
            options.update(ssl_ca_certs=str(self.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
        return options


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (``ca``; None: the system roots) and its own certificate for mTLS."""

    ca: PathLike | None = None
    cert: PathLike | None = None
    key: PathLike | None = None
    #: Name to check the server certificate against instead of the target's host.
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError(
                "a client certificate needs both --tls-cert and --tls-key", field="tls-cert"
            )
        self.grpc_credentials()

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for ``grpc.secure_channel``."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "--tls-ca") if self.ca is not None else None,
            private_key=_read(self.key, "--tls-key") if self.key is not None else None,
            certificate_chain=_read(self.cert, "--tls-cert") if self.cert is not None else None,
        )

    def grpc_options(self) -> list[tuple[str, str]]:
        """Channel options (the server name override, if any)."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    def ssl_context(self) -> ssl.SSLContext:
        """A client context for HTTPS (httpx ``verify=``)."""
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.cert is not None and self.key is not None:
            context.load_cert_chain(str(self.cert), str(self.key))
        return context
