"""/openapi.json: a valid OpenAPI document listing every route, tokenize at its configured path."""

from __future__ import annotations

import httpx
import pytest

from tokenkeys.frontend import HttpConfig

from http_support import HttpServerThread, registry

validator = pytest.importorskip("openapi_spec_validator")


def _spec(config: HttpConfig) -> dict:
    with HttpServerThread(registry(engines=False), config) as server:
        response = httpx.get(f"{server.url}/openapi.json")
    assert response.status_code == 200
    return response.json()


@pytest.mark.parametrize(
    "paths", [("/tokenize", "/detokenize"), ("/v1/tokenize", "/internal/detokenize")]
)
def test_openapi_validates_and_lists_every_route(paths) -> None:
    spec = _spec(HttpConfig(tokenize_path=paths[0], detokenize_path=paths[1]))
    validator.validate(spec)
    assert set(spec["paths"]) == {
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        paths[0],
        paths[1],
        "/tokenizer_info",
        "/health",
        "/livez",
        "/version",
        "/metrics",
        "/v1/completions/render",
        "/v1/chat/completions/render",
        # Anthropic's Messages API (issue 34).
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/messages/render",
        "/v1/responses",
        "/v1/responses/render",
        # vLLM's derender routes (issue 34).
        "/v1/completions/derender",
        "/v1/chat/completions/derender",
    }
    tokenize = spec["paths"][paths[0]]["post"]
    refs = tokenize["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    names = [r["$ref"].rsplit("/", 1)[1] for r in refs]
    assert names == ["TokenizeCompletionRequest", "TokenizeChatRequest"]
    schemas = spec["components"]["schemas"]
    assert {"prompt"} <= set(schemas["TokenizeCompletionRequest"]["required"])
    chat = schemas["TokenizeChatRequest"]["properties"]
    assert chat["add_generation_prompt"]["default"] is True
    assert chat["continue_final_message"]["default"] is False
    assert set(tokenize["responses"]) >= {"200", "400", "404", "413", "501"}
    ok = tokenize["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ok.endswith("/TokenizeResponse")
