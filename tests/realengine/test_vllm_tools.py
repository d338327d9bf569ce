"""Acceptance (issue 33): tool calls straight from vLLM and through ``tokenkeys route``, the same.

vLLM 0.32 parses tool calls only when started with ``--enable-auto-tool-choice
--tool-call-parser NAME`` (without them it refuses ``tool_choice`` ``auto``, ``required`` and
named with a 400: ``vllm/renderers/online_renderer.py``). With a parser, ``required`` and a named
choice are forced through structured output (the tools' JSON schema, ``ToolParser.adjust_request``
in ``vllm/tool_parsers/abstract_tool_parser.py``), so even a random tiny model answers parsed
``tool_calls``; ``auto`` is parsed by the parser from free text. The parser here is
``pythonic``, which needs no special token (the tiny models' tokenizer is SmolLM2's).

The servers are the first hybrid layout's two (``test_vllm_hybrid.LAYOUTS[0]``, which carry the
parser): they only ever answer completions in the other modules that use them, on which a tool
parser acts not at all, so this module starts no server of its own, and the router goes over
two sidecars, as in production. Each request goes straight to the first vLLM and through the
router; the answers must be equal but for what each answer makes anew (ids, ``created``), and
``required`` and named choices must come back as parsed calls of the named functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from route_process import RouteProcess
from test_vllm_hybrid import LAYOUTS
from test_vllm_passthrough import _both, _fresh, _said, _salts

from served_pair import TokenkeysServe, running, sidecar_args
from vllm_server import MODEL_NAME, VllmServer

LAYOUT = LAYOUTS[0]

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(*LAYOUT.vllm_servers)]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 plus 3?"}]
NAMED = {"type": "function", "function": {"name": "add"}}

CASES = {
    "required": {"messages": ASK, "tools": TOOLS, "tool_choice": "required"},
    "named": {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED},
    "auto": {"messages": ASK, "tools": TOOLS, "tool_choice": "auto"},
    "none": {"messages": ASK, "tools": TOOLS, "tool_choice": "none"},
}
#: The functions a choice must have called (auto and none: whatever the model says).
CALLED = {"required": {"get_weather", "add"}, "named": {"add"}}


@pytest.fixture(scope="module")
def engines(vllm_pool) -> list[VllmServer]:
    return [vllm_pool.get(config) for config in LAYOUT.vllm_servers]


@pytest.fixture(scope="module")
def router(engines, tmp_path_factory) -> Iterator[RouteProcess]:
    sidecars = [TokenkeysServe(*sidecar_args(engine)) for engine in engines]
    workers = [a for s in sidecars for a in ("--worker", s.target)]
    cache = str(tmp_path_factory.mktemp("route-cache"))
    with running(*sidecars), RouteProcess(*workers, "--poll-interval", "1", cache=cache) as r:
        yield r


def _calls(message: dict) -> list[tuple[str, dict]]:
    """The parsed calls of a message: (function name, arguments as JSON)."""
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or ()
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tool_choices_through_the_router_answer_as_vllm(engines, router, case, stream) -> None:
    body = {**CASES[case], "max_tokens": 60, "temperature": 0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    theirs, ours = _both(engines[0], router, "/v1/chat/completions", body, stream)
    assert ours == theirs
    choice = ours["choices"][0]
    message = choice if stream else choice["message"]
    if case in CALLED:
        calls = _calls(message)
        assert calls and {name for name, _ in calls} <= CALLED[case], message
        assert all(isinstance(arguments, dict) for _, arguments in calls)
    if case == "required":
        assert choice["finish_reason"] in ("tool_calls", "length")


def test_the_openai_client_gets_vllms_parsed_calls(engines, router) -> None:
    answers = []
    for url in (engines[0].url, router.url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
        whole = client.chat.completions.create(
            model=MODEL_NAME,
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=NAMED,  # type: ignore[arg-type]
            max_tokens=60,
            temperature=0,
            extra_body={"cache_salt": f"salt-{next(_salts)}"},
        )
        chunks = client.chat.completions.create(
            model=MODEL_NAME,
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required",
            max_tokens=60,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"cache_salt": f"salt-{next(_salts)}"},
        )
        said = _said([_fresh(c.model_dump()) for c in chunks])
        answers.append((_fresh(whole.model_dump()), said))
    assert answers[1] == answers[0]
    called = answers[1][0]["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in called] == ["add"]
