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
two sidecars, as in production. Each request goes through the router, then straight to the
vLLM behind the worker it chose; the answers must be equal but for what each answer makes anew
(ids, ``created``), and ``required`` and named choices must come back as parsed calls of the
functions offered.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from answers import answer_of, fresh, said
from route_process import RouteProcess
from test_vllm_hybrid import LAYOUTS

from served_pair import TokenkeysServe, running, sidecar_args
from vllm_server import MODEL_NAME, VllmServer

LAYOUT = LAYOUTS[0]

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(*LAYOUT.vllm_servers)]

#: Every forced call is short and bounded, so a random tiny model ends on a call, not on
#: ``max_tokens``: vLLM forces ``required`` through the JSON schema of an array of calls
#: (``_get_json_schema_from_tools``, ``vllm/tool_parsers/utils.py``: ``minItems`` 1, and
#: ``maxItems`` 1 only with ``parallel_tool_calls: false``), and a named choice through the
#: function's own parameters. So the string is bounded (``maxLength``), the integers are from
#: an enum (greedy decoding of unbounded digits need not stop), no other property is allowed,
#: and ``required`` asks for one call (``REQUIRED``).
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
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of two small integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                    "b": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 plus 3?"}]
NAMED = {"type": "function", "function": {"name": "add"}}
CHAT = "/v1/chat/completions"
_salts = itertools.count()

CASES = {
    "required": {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
    },
    "named": {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED},
    "auto": {"messages": ASK, "tools": TOOLS, "tool_choice": "auto"},
    "none": {"messages": ASK, "tools": TOOLS, "tool_choice": "none"},
}
#: Room for the forced JSON of a call or two from a random model.
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def engines(vllm_pool) -> list[VllmServer]:
    return [vllm_pool.get(config) for config in LAYOUT.vllm_servers]


@dataclass
class Door:
    """``tokenkeys route`` over the two sidecars, and the vLLM behind each sidecar."""

    router: RouteProcess
    behind: dict[str, VllmServer]

    def pair(self, body: dict, stream: bool):  # noqa: ANN201 - two answers
        """(the answer of the vLLM the router chose, the router's), each with its own salt:
        the router first, then the same request straight to the engine behind the sidecar
        it chose (the two engines serve the same weights; this compares even what a
        difference between two engine processes could change)."""

        def sent() -> dict:
            salt = f"tools-{next(_salts)}"
            return {"model": MODEL_NAME, **body, "stream": stream, "cache_salt": salt}

        routed = httpx.post(f"{self.router.url}{CHAT}", json=sent(), timeout=600)
        assert routed.status_code == 200, routed.text
        engine = self.behind[routed.headers["x-tokenkeys-worker"]]
        straight = httpx.post(f"{engine.url}{CHAT}", json=sent(), timeout=600)
        assert straight.status_code == 200, straight.text
        return answer_of(straight, stream)[1], answer_of(routed, stream)[1]


@pytest.fixture(scope="module")
def door(engines, tmp_path_factory) -> Iterator[Door]:
    sidecars = [TokenkeysServe(*sidecar_args(engine)) for engine in engines]
    workers = [a for s in sidecars for a in ("--worker", s.target)]
    cache = str(tmp_path_factory.mktemp("route-cache"))
    with running(*sidecars), RouteProcess(*workers, "--poll-interval", "1", cache=cache) as r:
        yield Door(r, {s.target: e for s, e in zip(sidecars, engines, strict=True)})


def _called(choice: dict, case: str) -> None:
    """The calls a ``required`` or named choice must show: parsed ``tool_calls`` of the
    functions offered (the named one only), finished, whose arguments are JSON objects (the
    servers' structured output allows no free whitespace, so a forced call ends)."""
    message = choice.get("message") or choice
    calls = message.get("tool_calls") or []
    names = {c["function"]["name"] for c in calls}
    assert choice["finish_reason"] in ("tool_calls", "stop"), choice
    if case == "named":
        assert names == {"add"}, choice
    else:
        assert calls and names <= {"get_weather", "add"}, choice
    assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_tool_choices_through_the_router_answer_as_vllm(door, case, stream) -> None:
    body = {**CASES[case], "max_tokens": MAX_TOKENS, "temperature": 0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    theirs, ours = door.pair(body, stream)
    assert ours == theirs
    print(f"tool_choice {case} ({'streamed' if stream else 'whole'}): {ours['choices'][0]}")
    if case in ("required", "named"):
        _called(ours["choices"][0], case)


def test_the_openai_client_gets_vllms_parsed_calls(door) -> None:
    # Through the router first (its raw response names the worker), then straight to the
    # engine behind that worker, for a named choice whole and a required one streamed.
    def client(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)

    def named(url: str):  # noqa: ANN202 - the raw response
        return client(url).chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=NAMED,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"cache_salt": f"tools-{next(_salts)}"},
        )

    def required(url: str):  # noqa: ANN202 - the raw response
        return client(url).chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=ASK,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"cache_salt": f"tools-{next(_salts)}"},
        )

    for call, parse in (
        (named, lambda raw: fresh(raw.parse().model_dump())),
        (required, lambda raw: said([fresh(c.model_dump()) for c in raw.parse()])),
    ):
        routed = call(door.router.url)
        engine = door.behind[routed.headers["x-tokenkeys-worker"]]
        ours, theirs = parse(routed), parse(call(engine.url))
        assert ours == theirs
        _called(ours["choices"][0], "named" if call is named else "required")
