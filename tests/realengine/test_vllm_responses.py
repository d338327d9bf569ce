"""Acceptance (issue 34): OpenAI Responses generated through the sidecar as a real vLLM 0.32 does.

A real ``vllm serve`` (the default configuration, shared with the other modules of its family)
and ``tokenkeys serve`` as its sidecar. Over the Responses corpus (``anthropic_corpus``: input
as a string or items, instructions, tools, previous turns carried in the input, reasoning
effort, an unfinished assistant turn): the prompt vLLM's own ``/v1/responses`` reports in
``usage.input_tokens`` is tokenkeys' count (the length of its render), and ``/v1/responses``
through the sidecar answers what vLLM answers directly, whole and streamed (each side with its
own ``cache_salt``, so both compute the whole prompt; ids and timestamps aside). A
``previous_response_id`` gets vLLM's own answer without a response store (404).
``truncation: auto`` is served within the context (in the corpus) and refused (501) over it,
where vLLM cuts the prompt (pinned here).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import anthropic_corpus
import httpx
import pytest

from vllm_server import DEFAULT_CONFIG, MAX_MODEL_LEN, MODEL_NAME

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

GENERATED = [
    (label, body)
    for label, body in anthropic_corpus.responses_requests()
    if label not in ("stream", "bare-output-text")
] + [("truncation-auto", {"input": "Which trains leave Alder?", "truncation": "auto"})]
#: Keys that differ between any two answers: random ids, the clock, and the place of an event
#: in a stream whose text deltas are joined (see :func:`_events`).
_VARYING = frozenset({"id", "item_id", "created_at", "sequence_number"})
_salts = itertools.count()


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": MODEL_NAME, **body}, timeout=300)


def _steady(value: Any) -> Any:
    """``value`` without the keys that differ between two answers (:data:`_VARYING`)."""
    if isinstance(value, list):
        return [_steady(v) for v in value]
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in _VARYING}
    return value


def test_vllm_responses_usage_is_the_count(vllm, sidecar) -> None:
    for label, body in GENERATED:
        sent = {**body, "max_output_tokens": 2, "temperature": 0}
        answer = _post(vllm.url, "/v1/responses", sent)
        assert answer.status_code == 200, (label, answer.text)
        rendered = _post(sidecar.url, "/v1/responses/render", sent)
        assert rendered.status_code == 200, (label, rendered.text)
        count = len(rendered.json()["token_ids"])
        assert answer.json()["usage"]["input_tokens"] == count, label


def _events(response: httpx.Response) -> list[tuple[str, Any]]:
    """(event, data) of a Responses event stream without :data:`_VARYING` keys, each run of
    text deltas of one part joined: vLLM sends the tokens a step produced while the reader was
    busy in one event, so where a stream is cut varies from run to run (what it says does not)."""
    out: list[tuple[str, Any]] = []
    event = None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = _steady(json.loads(line[6:]))
            last = out[-1] if out else None
            if (
                event == "response.output_text.delta"
                and last is not None
                and last[0] == event
                and (last[1]["output_index"], last[1]["content_index"])
                == (data["output_index"], data["content_index"])
            ):
                last[1]["delta"] += data["delta"]
                last[1]["logprobs"] += data.get("logprobs") or []
                continue
            out.append((event, data))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_sidecar_responses_answer_vllms(vllm, sidecar, stream: bool) -> None:
    for label, body in GENERATED[::3] if stream else GENERATED:
        sent = {**body, "temperature": 0, "max_output_tokens": 6, "stream": stream}
        theirs = _post(vllm.url, "/v1/responses", {**sent, "cache_salt": f"v{next(_salts)}"})
        ours = _post(sidecar.url, "/v1/responses", {**sent, "cache_salt": f"t{next(_salts)}"})
        assert ours.status_code == theirs.status_code == 200, (label, ours.text, theirs.text)
        if stream:
            assert _events(ours) == _events(theirs), label
        else:
            assert _steady(ours.json()) == _steady(theirs.json()), label


def test_previous_response_id_is_vllms_not_found(vllm, sidecar) -> None:
    body = {"input": "Hi", "previous_response_id": "resp_unknown", "max_output_tokens": 2}
    theirs = _post(vllm.url, "/v1/responses", body)
    ours = _post(sidecar.url, "/v1/responses", body)
    assert theirs.status_code == 404, theirs.text
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


#: What the simulated engine's answer cannot share with vLLM's: what was generated.
_GENERATED = frozenset({"output", "usage", "status", "incomplete_details"})


def test_simulated_answer_has_vllms_shape(pair) -> None:
    """``tokenkeys serve`` on its simulated engine answers /v1/responses with vLLM's keys and
    the same echo of the request (sampling defaults, budget, tools, tool choice, ...); only
    what was generated differs. The prompt is the same: usage.input_tokens is equal."""
    echoed = [(label, body) for label, body in GENERATED if label == "effort"]
    echoed += [("echo", {"input": "Hi", "top_p": 0.5, "user": "u", "metadata": {"k": "v"}})]
    for label, body in GENERATED[::4] + echoed:
        theirs, ours = pair.both("/v1/responses", {**body, "max_output_tokens": 3})
        assert ours.status_code == theirs.status_code == 200, (label, ours.text, theirs.text)
        want, got = _steady(theirs.json()), _steady(ours.json())
        assert set(got) == set(want), label
        assert {k: v for k, v in got.items() if k not in _GENERATED} == {
            k: v for k, v in want.items() if k not in _GENERATED
        }, label
        assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"], label
        assert set(got["usage"]) == set(want["usage"]), label


def test_truncation_auto_over_the_context_is_cut_by_vllm_and_refused_here(vllm, sidecar) -> None:
    """What docs/api.md says vLLM does and tokenkeys refuses: vLLM 0.32 cuts the prompt to
    the context less one token (``max_truncation_tokens``) and answers; tokenkeys never cuts."""
    body = {"input": "Hi there " * MAX_MODEL_LEN, "truncation": "auto", "max_output_tokens": 1}
    theirs = _post(vllm.url, "/v1/responses", body)
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["usage"]["input_tokens"] == MAX_MODEL_LEN - 1
    ours = _post(sidecar.url, "/v1/responses", body)
    assert ours.status_code == 501, ours.text
    assert ours.json()["error"]["param"] == "truncation"
