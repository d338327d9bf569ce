"""Fetch the bytes an image part points at, bounded in time and size, under a policy.

The URL forms are vLLM 0.32's (``vllm/multimodal/media/connector.py``, ``MediaConnector``):
``data:[<mediatype>][;<param>=<value>]*;base64,<data>`` (base64 only, strictly decoded),
``file:`` under the allowed local folder (``--allowed-local-media-path``; the resolved path must
be inside it), and ``http(s):`` from the allowed domains (``--allowed-media-domains``; empty
allows any). Beyond what vLLM checks, a fetch here is bounded: connect and read timeouts, a
deadline for the whole transfer, a byte cap, a redirect limit with every hop checked again, and
no private, loopback, link-local or reserved address unless the policy allows them. Every
refusal is an :class:`~tokenkeys.errors.InvalidArgument` naming the part's field.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit
from urllib.request import url2pathname

import httpx

from tokenkeys.errors import InvalidArgument

#: vllm/envs.py VLLM_IMAGE_FETCH_TIMEOUT (seconds).
DEFAULT_TIMEOUT = 5.0
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_REDIRECTS = 3


@dataclass(frozen=True)
class MediaPolicy:
    """Where media may come from and how much of it; one per served model."""

    allowed_local_media_path: Path | None = None
    allowed_media_domains: tuple[str, ...] = ()
    allow_private_addresses: bool = False
    connect_timeout: float = DEFAULT_TIMEOUT
    read_timeout: float = DEFAULT_TIMEOUT
    deadline: float = 2 * DEFAULT_TIMEOUT
    max_bytes: int = DEFAULT_MAX_BYTES
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    schemes: frozenset[str] = field(default=frozenset({"data", "file", "http", "https"}))


def _bad(where: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{where}: {message}", field=where)


def load_url(url: object, policy: MediaPolicy, *, where: str) -> bytes:
    """The encoded media ``url`` names; refusals name ``where`` (the part's field)."""
    if not isinstance(url, str) or not url:
        raise _bad(where, "url must be a non-empty string")
    if url[:5].lower() == "data:":
        return _data_url(url, policy, where)
    scheme = urlsplit(url).scheme.lower()
    if scheme not in policy.schemes:
        raise _bad(where, "the URL must be either a HTTP, data or file URL")
    if scheme == "file":
        return _file_url(url, policy, where)
    return _http(url, policy, where)


def _data_url(url: str, policy: MediaPolicy, where: str) -> bytes:
    spec, sep, payload = url[5:].partition(",")
    if not sep:
        raise _bad(where, f"invalid data URL {url[:32]!r}: missing ',' separator")
    _media_type, sep, encoding = spec.rpartition(";")
    if not sep or encoding != "base64":
        raise _bad(where, "only base64 data URLs are supported")
    if len(payload) > (policy.max_bytes + 2) // 3 * 4 + 4:
        raise _bad(where, f"the data URL holds more than {policy.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(where, f"the data URL is not valid base64: {exc}") from None


def _file_url(url: str, policy: MediaPolicy, where: str) -> bytes:
    root = policy.allowed_local_media_path
    if root is None:
        raise _bad(where, "cannot load local files without an allowed local media path")
    parts = urlsplit(url)
    path = Path(url2pathname(parts.netloc + parts.path))
    resolved = path.resolve()
    if root.resolve() not in resolved.parents:
        raise _bad(where, f"the file path {path} must be inside the allowed local media path")
    try:
        size = resolved.stat().st_size
        if size > policy.max_bytes:
            raise _bad(where, f"the file has {size} bytes, at most {policy.max_bytes} are allowed")
        return resolved.read_bytes()
    except OSError as exc:
        raise _bad(where, f"cannot read {path}: {exc.strerror}") from None


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether media may come from ``address`` without allowing private addresses."""
    return address.is_global


def _check_host(host: str, port: int, policy: MediaPolicy, where: str) -> None:
    domains = policy.allowed_media_domains
    if domains and host not in domains:
        raise _bad(
            where, f"the URL must be from one of the allowed domains {list(domains)}, not {host}"
        )
    if policy.allow_private_addresses:
        return
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise _bad(where, f"cannot resolve {host}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if not _public(address):
            raise _bad(
                where,
                f"{host} resolves to {address}, a private, loopback or reserved address; "
                "media from such addresses is not allowed",
            )


def _http(url: str, policy: MediaPolicy, where: str) -> bytes:
    timeout = httpx.Timeout(
        connect=policy.connect_timeout,
        read=policy.read_timeout,
        write=policy.read_timeout,
        pool=policy.connect_timeout,
    )
    start = time.monotonic()
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for _hop in range(policy.max_redirects + 1):
            parts = urlsplit(url)
            if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
                raise _bad(where, f"cannot fetch {url[:64]!r}: not an http(s) URL with a host")
            port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
            _check_host(parts.hostname, port, policy, where)
            try:
                with client.stream("GET", url) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code != 200:
                        raise _bad(where, f"fetching the image answered {response.status_code}")
                    return _body(response, policy, where, start)
            except httpx.TimeoutException:
                raise _bad(where, "fetching the image timed out") from None
            except httpx.HTTPError as exc:
                raise _bad(where, f"fetching the image failed: {exc}") from None
    raise _bad(where, f"more than {policy.max_redirects} redirects")


def _body(response: httpx.Response, policy: MediaPolicy, where: str, start: float) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
        raise _bad(where, f"the image has {declared} bytes, at most {policy.max_bytes} allowed")
    chunks: list[bytes] = []
    total = 0
    # As received, not in fixed-size chunks: a server trickling bytes (each read in time)
    # must meet the deadline too, and a buffered chunk would hide every byte until it fills.
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > policy.max_bytes:
            raise _bad(where, f"the image has more than {policy.max_bytes} bytes")
        if time.monotonic() - start > policy.deadline:
            raise _bad(where, f"fetching the image took longer than {policy.deadline:g} s")
        chunks.append(chunk)
    return b"".join(chunks)
