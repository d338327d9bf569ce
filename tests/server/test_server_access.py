"""Access control of ``tokenkeys serve``: loopback binds by default, TLS and mutual TLS for gRPC
and HTTP, bearer tokens (never printed), health exempt, allowed template folders; the clients
(TokenizerClient, pull, CLI --remote) with TLS and tokens. Certificates are made in the test."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from certs import Certs, make_certs
from engine_stack import start_stack
from served import Served

from tokenkeys._gen.openengine.v1 import kv_pb2, lifecycle_pb2, openengine_pb2_grpc, server_pb2
from tokenkeys.access import BearerTokens, ChannelSecurity, ClientTls, ServerTls, load_token
from tokenkeys.artifacts import PullSettings, fetch
from tokenkeys.cli import build_parser
from tokenkeys.client import TokenizerClient
from tokenkeys.engine.config import EngineConfig
from tokenkeys.errors import ConfigError, TokenkeysError, Unauthenticated

from support import run_cli

TOKEN = "s3cret-token-0123456789abcdef"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(f"old-token-abcdefghijklmnop\n{TOKEN}\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def served(certs: Certs, token_file: Path):
    args = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    args += ["--tls-client-ca", str(certs.ca), "--auth-token-file", str(token_file)]
    with Served(*args) as server:
        yield server


def _https(certs: Certs, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def _client(certs: Certs) -> ClientTls:
    return ClientTls(certs.ca, certs.client_cert, certs.client_key)


async def test_kv_event_sockets_bind_the_serve_host() -> None:
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    stack = await start_stack(EngineConfig())  # the host serve passes: 127.0.0.1 by default
    try:
        info = stack.runtime.parts(stack.models.names[0]).zmq_source()
        assert info.endpoint.startswith("tcp://127.0.0.1:")
        assert info.replay_endpoint.startswith("tcp://127.0.0.1:")
    finally:
        await stack.stop()


def test_serve_binds_loopback_and_says_what_is_on(served: Served) -> None:
    assert served.grpc_target.startswith("127.0.0.1:")
    assert served.http_address.startswith("127.0.0.1:")
    assert "TLS on gRPC and HTTP, client certificates required" in served.lines
    assert any("bearer-token authentication on" in line for line in served.lines)


def test_https_with_client_certificate_and_token(served: Served, certs: Certs) -> None:
    url = f"https://{served.http_address}"
    verify = _https(certs, certs.client_cert, certs.client_key)
    with httpx.Client(base_url=url, verify=verify) as client:
        assert client.get("/health").status_code == 200  # exempt by default
        refused = client.post("/tokenize", json={"prompt": "hi"})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        error = refused.json()["error"]
        assert error["type"] == "AuthenticationError" and "bearer token" in error["message"]
        wrong = client.post(
            "/tokenize", json={"prompt": "hi"}, headers={"authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and "not valid" in wrong.json()["error"]["message"]
        headers = {"authorization": f"Bearer {TOKEN}"}
        ok = client.post("/tokenize", json={"prompt": "hi"}, headers=headers)
        assert ok.status_code == 200 and ok.json()["count"] == 1
        old = client.get(
            "/v1/models", headers={"authorization": "bearer old-token-abcdefghijklmnop"}
        )
        assert old.status_code == 200  # every line of the file is a token; the scheme is caseless


def test_https_refuses_plain_http_and_unknown_client_certificates(
    served: Served, certs: Certs
) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{served.http_address}/health", timeout=5)
    for cert, key in ((None, None), (certs.rogue_cert, certs.rogue_key)):
        with pytest.raises((httpx.HTTPError, ssl.SSLError)):
            httpx.get(
                f"https://{served.http_address}/health",
                verify=_https(certs, cert, key),
                timeout=5,
            ).raise_for_status()


def test_grpc_with_tls_and_token(served: Served, certs: Certs) -> None:
    security = ChannelSecurity(_client(certs), TOKEN)
    with TokenizerClient(served.grpc_target, security=security) as client:
        assert client.tokenize(["hello world"]).results[0].count == 2
    with TokenizerClient(served.grpc_target, security=ChannelSecurity(_client(certs))) as client:
        with pytest.raises(Unauthenticated, match="requires a bearer token"):
            client.tokenize(["hello"])
    wrong = ChannelSecurity(_client(certs), "x" * 20)
    with TokenizerClient(served.grpc_target, security=wrong) as client:
        with pytest.raises(Unauthenticated, match="not valid"):
            client.info()
    # Health answers without a token (probes); plain TCP and unknown certificates get nothing.
    with ChannelSecurity(_client(certs)).channel(served.grpc_target) as channel:
        health = openengine_pb2_grpc.ControlStub(channel).Health(lifecycle_pb2.HealthRequest())
        assert health.state == lifecycle_pb2.HEALTH_STATE_READY
    rogue = ClientTls(certs.ca, certs.rogue_cert, certs.rogue_key)
    for security in (ChannelSecurity(None, TOKEN), ChannelSecurity(rogue, TOKEN)):
        with TokenizerClient(served.grpc_target, security=security, timeout=5) as client:
            with pytest.raises(TokenkeysError) as info:
                client.info()
            assert info.value.details["grpc_code"] == "UNAVAILABLE"


def test_cli_remote_and_pull_with_tls_and_token(
    served: Served, certs: Certs, token_file: Path, tmp_path: Path
) -> None:
    single = tmp_path / "token"
    single.write_text(TOKEN + "\n", encoding="utf-8")
    tls = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert)]
    tls += ["--tls-key", str(certs.client_key)]
    result = run_cli(
        "tokenize", "--remote", served.grpc_target, *tls, "--auth-token-file", str(single), "hi"
    )
    assert result.stdout.split() == ["6004"]
    refused = run_cli("tokenize", "--remote", served.grpc_target, *tls, "hi", check=False)
    assert refused.returncode == 2 and "bearer token" in refused.stderr
    pulled = run_cli(
        "pull",
        served.grpc_target,
        *tls,
        "--auth-token-env",
        "TK_TOKEN",
        "--cache",
        str(tmp_path / "cache"),
        "--json",
        env_extra={"TK_TOKEN": TOKEN},
    )
    assert '"from_cache": false' in pulled.stdout
    settings = PullSettings(security=ChannelSecurity(_client(certs), TOKEN))
    assert fetch(served.grpc_target, cache=tmp_path / "cache", settings=settings).from_cache
    keys = run_cli(
        "keys",
        "--remote",
        served.grpc_target,
        *tls,
        "--auth-token-file",
        str(single),
        "--tokens",
        ",".join(["1"] * 32),
        "--json",
    )
    assert len(json.loads(keys.stdout)["keys"]) == 2  # two full 16-token blocks


def test_tokens_never_reach_the_logs(served: Served) -> None:
    assert not any(TOKEN in line for line in served.lines + served.errors)
    assert TOKEN not in repr(BearerTokens([TOKEN], "test"))
    assert TOKEN not in repr(ChannelSecurity(None, TOKEN))


def test_weak_or_missing_tokens_are_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        BearerTokens(["short"], "test")
    with pytest.raises(ConfigError, match="holds no token"):
        BearerTokens.load(env="TK_ABSENT", environ={})
    assert load_token(env="TK", environ={"TK": TOKEN}) == TOKEN
    empty = tmp_path / "empty"
    empty.write_text("\n", encoding="utf-8")
    result = run_cli("serve", "--grpc-port", "0", "--auth-token-file", str(empty), check=False)
    assert result.returncode == 2 and "holds no token" in result.stderr


def test_tls_options_are_checked_at_start(certs: Certs, tmp_path: Path) -> None:
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a PEM file"):
        ServerTls(not_pem, certs.server_key)
    result = run_cli("serve", "--grpc-port", "0", "--tls-cert", str(certs.server_cert), check=False)
    assert result.returncode == 2 and "--tls-key" in result.stderr
    with pytest.raises(ConfigError, match="both"):
        ClientTls(certs.ca, cert=certs.client_cert)


def test_chat_template_outside_the_allowed_folders_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "t.jinja"
    outside.write_text("{{ messages[0].content }}", encoding="utf-8")
    result = run_cli("serve", "--grpc-port", "0", "--chat-template", str(outside), check=False)
    assert result.returncode == 2 and "outside the folders" in result.stderr
    assert "--allowed-template-dir" in result.stderr
    # A symbolic link inside an allowed folder to a file outside it is refused as well.
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "link.jinja").symlink_to(outside)
    result = run_cli(
        "serve",
        "--grpc-port",
        "0",
        "--chat-template",
        str(allowed / "link.jinja"),
        "--allowed-template-dir",
        str(allowed),
        check=False,
    )
    assert result.returncode == 2 and "outside the folders" in result.stderr


async def test_token_metadata_is_added_by_the_aio_channel(served: Served, certs: Certs) -> None:
    request = server_pb2.GetServerInfoRequest()
    async with ChannelSecurity(_client(certs), TOKEN).aio_channel(served.grpc_target) as channel:
        info = await openengine_pb2_grpc.ControlStub(channel).GetServerInfo(request)
        assert info.instance_id
        streamed = openengine_pb2_grpc.ControlStub(channel).SubscribeKvEvents(
            kv_pb2.SubscribeKvEventsRequest()
        )
        streamed.cancel()
    async with ChannelSecurity(_client(certs)).aio_channel(served.grpc_target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await openengine_pb2_grpc.ControlStub(channel).GetServerInfo(request)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
