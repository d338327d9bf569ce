"""Where a worker's OpenAI HTTP frontend lives: advertised, or named beside its gRPC address.

A tokenkeys worker advertises its frontend in ``ServerInfo.http_frontend`` (``http://host:port``;
an empty host means the host the router reached the worker's gRPC at). ``--worker
GRPC_HOST:PORT,http://HOST:PORT`` names it instead (a worker behind a proxy, or one that does
not advertise it); the named one wins. A worker with neither is served through OpenEngine
``Generate``, as before the front door.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from tokenkeys.errors import ConfigError
from tokenkeys.router.workers.discovery import check_address
from tokenkeys.router.workers.state import WorkerState


def split_worker(spec: str) -> tuple[str, str | None]:
    """``HOST:PORT`` or ``HOST:PORT,http(s)://HOST:PORT`` -> (gRPC address, HTTP URL or None)."""
    address, _, url = spec.partition(",") if isinstance(spec, str) else (spec, "", "")
    check_address(address)
    if not url:
        return address, None
    return address, check_url(url)


def check_url(url: str) -> str:
    """``url`` without a trailing slash if it is ``http(s)://HOST:PORT``; ConfigError otherwise."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or port is None or parts.query or parts.fragment:
        raise ConfigError(
            f"worker HTTP frontend {url!r} is not http(s)://HOST:PORT; give it as "
            "--worker GRPC_HOST:PORT,http://HOST:PORT",
            field="worker",
        )
    return url.rstrip("/")


def _host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


class WorkerFrontends:
    """The HTTP frontend of each worker: the one named on the command line, else advertised."""

    def __init__(self, workers: Mapping[str, WorkerState], named: Mapping[str, str]) -> None:
        self._workers = workers
        self._named = dict(named)
        #: advertised URL as read -> its base URL (asked twice per forwarded request).
        self._parsed: dict[tuple[str, str], str] = {}

    def url(self, address: str) -> str | None:
        """The base URL of ``address``'s frontend, or None when it has none."""
        named = self._named.get(address)
        if named is not None:
            return named
        ws = self._workers.get(address)
        advertised = ws.description.http_frontend if ws and ws.description else ""
        if not advertised:
            return None
        known = self._parsed.get((address, advertised))
        if known is not None:
            return known
        parts = urlsplit(advertised)
        if not parts.hostname:  # "http://:8000": the host this router reaches the worker at
            url = f"{parts.scheme}://{_host_of(address)}:{parts.port}"
        else:
            url = advertised.rstrip("/")
        if len(self._parsed) > 4096:  # workers come and go: bounded
            self._parsed.clear()
        self._parsed[(address, advertised)] = url
        return url
