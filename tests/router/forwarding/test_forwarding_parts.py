"""The front door's parts on their own: worker specs, the promise, the event relay."""

from __future__ import annotations

import json

import httpx
import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.router.forwarding.frontends import WorkerFrontends, split_worker
from tokenkeys.router.forwarding.promise import Promise, expected_tokens, matched_at
from tokenkeys.router.forwarding.relay import events, request_headers
from tokenkeys.router.workers.discovery import WorkerDescription
from tokenkeys.router.workers.state import WorkerState


def test_a_worker_spec_names_grpc_and_optionally_http():
    assert split_worker("10.0.0.7:50051") == ("10.0.0.7:50051", None)
    assert split_worker("10.0.0.7:50051,http://10.0.0.7:8000/") == (
        "10.0.0.7:50051",
        "http://10.0.0.7:8000",
    )
    for bad in ("10.0.0.7:50051,10.0.0.7:8000", "h:1,ftp://h:2", "h:1,http://h", "nope"):
        with pytest.raises(ConfigError) as caught:
            split_worker(bad)
        assert caught.value.field == "worker"


def test_the_engine_never_serves_the_last_token_from_cache():
    # vLLM 0.32: max_cache_hit_length = num_tokens - 1, whole blocks below it.
    assert expected_tokens(4, 64, 16) == 48
    assert expected_tokens(4, 65, 16) == 64
    assert expected_tokens(2, 65, 16) == 32
    assert expected_tokens(0, 65, 16) == 0


def test_a_promise_against_its_answer():
    promise = Promise("w:1", "m", 16, (65, 40), (4, 1))
    assert promise.expected_tokens == 64 + 16
    assert promise.difference is None and not promise.over_promised
    served = promise.answered({"prompt_tokens_details": {"cached_tokens": 64}})
    assert served.difference == -16 and served.over_promised
    assert promise.answered({"prompt_tokens": 3}) is promise  # no cached_tokens: nothing known


class _Decision:
    def cached_blocks(self, worker: str) -> int:
        return {"w:1": 3, "w:2": 1}.get(worker, 0)


def test_a_request_for_prompt_logprobs_is_promised_no_cached_blocks():
    # vLLM reads nothing from its prefix cache for such a request (it computes every prompt
    # position's logprobs): SamplingParams.skip_reading_prefix_cache, vLLM 0.32.
    decisions = [_Decision(), _Decision()]
    assert matched_at("w:1", decisions, {"prompt": "x"}) == (3, 3)
    assert matched_at("w:2", decisions, {"prompt_logprobs": None}) == (1, 1)
    assert matched_at("w:1", decisions, {"prompt_logprobs": 0}) == (0, 0)
    assert matched_at("w:1", decisions, {"prompt_logprobs": 2}) == (0, 0)


def test_the_worker_gets_the_routers_credentials_not_the_clients():
    sent = request_headers(
        {
            "authorization": "Bearer client",
            "x-request-id": "r1",
            "traceparent": "00-abc-def-01",
            "content-length": "12",
            "connection": "keep-alive",
            "content-type": "application/json",
        },
        "router-token",
    )
    assert sent == {
        "authorization": "Bearer router-token",
        "x-request-id": "r1",
        "traceparent": "00-abc-def-01",
        "content-type": "application/json",
    }


class _Broken(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):  # noqa: ANN204
        for chunk in self.chunks:
            yield chunk
        raise httpx.RemoteProtocolError("peer closed connection")


async def test_events_are_relayed_whole_and_a_break_ends_with_an_error_and_done():
    # A real httpx response over a stream that breaks in the middle of the second event.
    stream = _Broken([b'data: {"a": 1}\n\ndata: {"b"', b': 2}\n\ndata: {"c'])
    response = httpx.Response(200, stream=stream)
    seen: list[bytes] = []
    out = b"".join([c async for c in events(response, seen.append)])
    assert seen == [b'data: {"a": 1}', b'data: {"b": 2}']
    parts = out.decode().split("\n\n")
    assert parts[:2] == ['data: {"a": 1}', 'data: {"b": 2}']
    assert json.loads(parts[2].removeprefix("data: "))["error"]["code"] == 503
    assert parts[3:] == ["data: [DONE]", ""]


def _worker(address: str, http_frontend: str) -> WorkerState:
    description = WorkerDescription(address, "i", "tokenkeys-sim", "0", (), http_frontend)
    return WorkerState(address, None, None, description=description)  # type: ignore[arg-type]


def test_where_a_workers_frontend_lives():
    workers = {
        "10.0.0.7:50051": _worker("10.0.0.7:50051", "http://10.0.0.7:8000"),
        "10.0.0.8:50051": _worker("10.0.0.8:50051", "http://:8000"),  # host: the one dialed
        "10.0.0.9:50051": _worker("10.0.0.9:50051", ""),  # gRPC only
    }
    named = {"10.0.0.7:50051": "http://proxy:9000"}
    frontends = WorkerFrontends(workers, named)
    assert frontends.url("10.0.0.7:50051") == "http://proxy:9000"  # named wins
    assert frontends.url("10.0.0.8:50051") == "http://10.0.0.8:8000"
    assert frontends.url("10.0.0.9:50051") is None
    assert WorkerFrontends(workers, {}).url("10.0.0.7:50051") == "http://10.0.0.7:8000"
