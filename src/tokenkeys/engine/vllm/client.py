"""A vLLM server's own HTTP API, as the sidecar (``--engine vllm+http://HOST:PORT``) uses it.

The calls the sidecar makes: ``/version`` (the release, hence its KV-event layout),
``/v1/models`` (served names, ``max_model_len``, LoRA adapters), ``/metrics``
(``vllm:cache_config_info`` and the load gauges), ``/tokenize`` (the start probe),
``/v1/completions`` with the prompt given as token ids, always streamed (the gRPC path: one
output per sampled token, ``return_token_ids`` so every chunk carries the ids), and
:meth:`VllmHttpClient.forward` / :meth:`VllmHttpClient.forward_stream`, which post an OpenAI
body as given and hand vLLM's answer back untouched (the HTTP pass-through).
Field names follow vLLM 0.32's OpenAI server (``vllm/entrypoints/openai``:
``CompletionRequest.return_token_ids``, ``stream_options.include_usage``,
``prompt_tokens_details.cached_tokens`` with ``--enable-prompt-tokens-details``).

Errors become tokenkeys errors: vLLM's 4xx answers keep its message (400 -> InvalidArgument,
404 -> NotFound), anything else and an unreachable server are :class:`Unavailable`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenkeys.errors import InvalidArgument, NotFound, TokenkeysError, Unavailable, Unsupported

#: Seconds to connect and to wait between two streamed chunks (a CPU engine can be slow).
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 600.0


@dataclass(frozen=True)
class VllmModel:
    """One entry of vLLM's ``/v1/models``: a served name, or a LoRA adapter (``parent`` set)."""

    name: str
    max_model_len: int | None
    root: str
    parent: str | None


@dataclass(frozen=True)
class VllmMetrics:
    """What the sidecar reads from vLLM's ``/metrics``: cache config labels and load gauges."""

    cache_config: dict[str, str] = field(default_factory=dict)
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0


class VllmHttpClient:
    """Async client of one vLLM OpenAI server at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout)

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self.down(exc) from None
        if response.status_code != 200:
            raise self._refusal(response.status_code, response.text)
        return response

    def down(self, exc: BaseException) -> Unavailable:
        """The error of a vLLM that does not answer."""
        return Unavailable(
            f"vLLM at {self.base_url} is unreachable: {type(exc).__name__}: {exc}", field="engine"
        )

    def _refusal(self, status: int, text: str) -> TokenkeysError:
        message = _error_message(text) or f"HTTP {status}"
        where = f"vLLM at {self.base_url}: {message}"
        if status == 400:
            return InvalidArgument(where, field=_error_param(text) or "prompt")
        if status == 404:
            return NotFound(where, field="model")
        return Unavailable(f"{where} (HTTP {status})", field="engine")

    async def version(self) -> str:
        """``/version``: the release vLLM reports (``{"version": "0.32.0"}`` in vLLM 0.32);
        "" when the answer carries none."""
        try:
            doc = (await self._request("GET", "/version")).json()
        except ValueError:  # not JSON
            return ""
        version = doc.get("version") if isinstance(doc, dict) else None
        return version if isinstance(version, str) else ""

    async def kv_event_sources(self) -> dict[str, dict[str, Any]]:
        """``/kv_event_sources``: the KV-event publisher configuration of each engine, by
        data-parallel rank (vLLM 0.32 ``EngineClient.get_kv_event_sources``, every
        ``KVEventsConfig`` field); {} when it answers something else."""
        try:
            doc = (await self._request("GET", "/kv_event_sources")).json()
        except ValueError:  # not JSON
            return {}
        if not isinstance(doc, dict):
            return {}
        return {str(rank): source for rank, source in doc.items() if isinstance(source, dict)}

    async def models(self) -> list[VllmModel]:
        """``/v1/models``: every served name and adapter."""
        data = (await self._request("GET", "/v1/models")).json().get("data", [])
        return [
            VllmModel(m["id"], m.get("max_model_len"), str(m.get("root", "")), m.get("parent"))
            for m in data
        ]

    async def metrics(self) -> VllmMetrics:
        """``/metrics``, reduced to the cache config and the gauges summed over engines."""
        text = (await self._request("GET", "/metrics")).text
        cache: dict[str, str] = {}
        sums = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
        usage = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info":
                    cache = dict(sample.labels)
                elif sample.name in sums:
                    sums[sample.name] += sample.value
                elif sample.name == "vllm:kv_cache_usage_perc":
                    usage = max(usage, sample.value)
        return VllmMetrics(
            cache,
            sums["vllm:num_requests_running"],
            sums["vllm:num_requests_waiting"],
            usage,
        )

    async def tokenize(self, model: str, text: str) -> list[int]:
        """vLLM's ``/tokenize`` of ``text`` (special tokens added, as its default)."""
        body = {"model": model, "prompt": text}
        return list((await self._request("POST", "/tokenize", json=body)).json()["tokens"])

    async def reset_prefix_cache(self) -> bool:
        """``POST /reset_prefix_cache`` (vLLM's local prefix cache, not a connector's): vLLM's
        ``success``, False while requests hold blocks. vLLM 0.32 serves the route only when
        started with ``VLLM_SERVER_DEV_MODE=1`` (``vllm/entrypoints/serve/dev/cache``); without
        it the 404 is Unsupported, naming the variable."""
        try:
            response = await self._http.post("/reset_prefix_cache")
        except httpx.HTTPError as exc:
            raise self.down(exc) from None
        if response.status_code == 404:
            raise Unsupported(
                f"vLLM at {self.base_url} has no /reset_prefix_cache: vLLM serves it only when "
                "started with VLLM_SERVER_DEV_MODE=1; restart vLLM with it to flush its cache",
                field="FlushCache",
            )
        if response.status_code != 200:
            raise self._refusal(response.status_code, response.text)
        return bool(response.json().get("success"))

    async def health(self) -> str | None:
        """None when ``/health`` answers 200 now, else what it answered (or why it did not)."""
        try:
            response = await self._http.get("/health", timeout=CONNECT_TIMEOUT)
        except httpx.HTTPError as exc:
            return f"vLLM at {self.base_url} does not answer /health ({type(exc).__name__})"
        if response.status_code != 200:
            return f"vLLM at {self.base_url} answers /health with HTTP {response.status_code}"
        return None

    async def forward(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Forwarded:
        """POST ``body`` to ``path``; vLLM's status and body, whatever they are.

        Only an unreachable vLLM raises (Unavailable): a refusal is vLLM's answer to give.
        """
        try:
            response = await self._http.post(path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise self.down(exc) from None
        return Forwarded(response.status_code, response.content)

    async def forward_stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Forwarded | None, AsyncIterator[bytes]]:
        """POST a streamed ``body``: (vLLM's refusal, empty) or (None, its SSE lines).

        The status is known before this returns, so a refused request keeps vLLM's status; the
        lines come as vLLM sent them (without their line ends) and the connection closes when
        the iterator is exhausted or closed.
        """
        try:
            request = self._http.build_request("POST", path, json=body, headers=headers)
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self.down(exc) from None
        if response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            return Forwarded(response.status_code, content), _nothing()
        return None, self._lines(response)

    async def _lines(self, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for line in response.aiter_lines():
                yield line.encode()
        except httpx.HTTPError as exc:
            raise self.down(exc) from None
        finally:
            await response.aclose()

    async def complete(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``/v1/completions`` for ``body`` (token-id prompt); yield each JSON chunk.

        ``stream``, ``stream_options.include_usage`` and ``return_token_ids`` are set here.
        """
        body = {
            **body,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        try:
            async with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    raise self._refusal(response.status_code, (await response.aread()).decode())
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:  # vLLM reports a failure mid-stream as a chunk
                        raise self._refusal(int(chunk["error"].get("code") or 500), data)
                    yield chunk
        except httpx.HTTPError as exc:
            raise self.down(exc) from None


@dataclass(frozen=True)
class Forwarded:
    """vLLM's answer to a forwarded request: its status and body, exactly as it sent them."""

    status: int
    body: bytes


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # an empty async generator


def _error_body(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    inner = doc.get("error")
    return inner if isinstance(inner, dict) else doc


def _error_message(text: str) -> str:
    message = _error_body(text).get("message")
    return str(message) if message else text.strip()[:500]


def _error_param(text: str) -> str | None:
    param = _error_body(text).get("param")
    return str(param) if param else None
