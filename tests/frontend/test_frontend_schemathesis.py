"""Schema-driven fuzzing of every route in /openapi.json against a real uvicorn server.

schemathesis draws requests from the served OpenAPI document, valid ones and invalid ones
(wrong types, missing and extra fields, out-of-range values); the server never answers 5xx
except the documented 501 (what generation cannot do exactly), every refusal carries an
OpenAI error body, and the server keeps serving. Derandomized, a bounded number of examples
per route and mode.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from http_support import HttpServerThread, registry

EXAMPLES = 30


@pytest.fixture(scope="module")
def server():
    with HttpServerThread(registry()) as running:
        yield running


def _operations():
    with HttpServerThread(registry()) as running:
        schema = running.app.openapi()
    loaded = schemathesis.openapi.from_dict(schema)
    return [result.ok() for result in loaded.get_all_operations()]


OPERATIONS = _operations()


def _has_input(operation) -> bool:  # noqa: ANN001
    raw = operation.definition.raw
    return bool(raw.get("requestBody") or raw.get("parameters"))


# Invalid requests need an input to make invalid: routes without one are fuzzed positively only.
CASES = [
    pytest.param(op, mode, id=f"{op.label}-{mode.value}")
    for op in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or _has_input(op)
]


#: Every route the served document names; a new route must be added here, so it is fuzzed too.
ROUTES = {
    "GET /health",
    "GET /livez",
    "GET /metrics",
    "GET /tokenizer_info",
    "GET /v1/models",
    "GET /version",
    "POST /detokenize",
    "POST /tokenize",
    "POST /v1/chat/completions",
    "POST /v1/chat/completions/derender",
    "POST /v1/chat/completions/render",
    "POST /v1/completions",
    "POST /v1/completions/derender",
    "POST /v1/completions/render",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/messages/render",
    "POST /v1/responses",
    "POST /v1/responses/render",
}


def test_every_route_is_covered() -> None:
    assert {op.label for op in OPERATIONS} == ROUTES


@pytest.mark.parametrize(("operation", "mode"), CASES)
def test_no_server_errors_but_documented_501(server, operation, mode) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(operation.as_strategy(generation_mode=mode))
    def check(case) -> None:  # noqa: ANN001
        response = case.call(base_url=server.url, timeout=60)
        status = response.status_code
        assert status < 500 or status == 501, (
            f"{case.method} {case.formatted_path} answered {status}: {response.text[:300]}"
        )
        if status >= 400 and case.path != "/health":
            error = response.json()["error"]
            assert error["code"] == status and error["message"]

    check()
    assert httpx.get(f"{server.url}/health").status_code == 200
