"""What an OpenAI answer says, whole or streamed, without what each answer makes anew.

Two answers to the same request (vLLM's straight, and through the sidecar or the router) are
compared by these: a stream's chunks cut where the engine's steps fell, which varies from run to
run, so a stream is compared by what it says once joined.
"""

from __future__ import annotations

import json

import httpx


def fresh(value):  # noqa: ANN001, ANN202 - any JSON value
    """An answer without what each answer makes anew."""
    if isinstance(value, dict):
        return {k: fresh(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [fresh(v) for v in value]
    return value


#: Choice fields a stream sends whole, once (every other string is a delta to concatenate).
_WHOLE = {"finish_reason", "stop_reason", "role", "index", "type", "id", "name"}


def _merge(into: dict, part: dict) -> None:
    for key, value in part.items():
        old = into.get(key)
        if key == "tool_calls" and isinstance(value, list):
            # Streamed tool calls come in fragments naming their call's index; a call's
            # fragments join whatever the cut (the arguments are a string delta).
            calls = into[key] = old or []  # the openai client dumps an absent list as None
            for fragment in value:
                index = fragment.get("index", 0)
                while len(calls) <= index:
                    calls.append({})
                _merge(calls[index], fragment)
        elif isinstance(value, str) and isinstance(old, str) and key not in _WHOLE:
            into[key] = old + value
        elif isinstance(value, list) and isinstance(old, list):
            into[key] = old + value
        elif isinstance(value, dict) and isinstance(old, dict):
            _merge(old, value)
        elif value is not None or key not in into:
            into[key] = value


def said(chunks: list[dict]) -> dict:
    """What a stream says, whatever the cut between its chunks (vLLM sends the tokens a step
    produced while the reader was busy in one chunk, so the cut varies from run to run):
    per choice the concatenated text, ids and logprobs and the last finish reason; the other
    chunk fields (usage, prompt ids and text, fingerprint) as sent."""
    choices: dict[int, dict] = {}
    rest: dict = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            flat = {k: v for k, v in choice.items() if k != "delta"} | (choice.get("delta") or {})
            _merge(choices.setdefault(choice["index"], {}), flat)
        for key, value in chunk.items():
            if key != "choices" and value is not None:
                rest[key] = value
    return {"choices": [choices[i] for i in sorted(choices)], **rest}


def answer_of(response: httpx.Response, stream: bool):  # noqa: ANN202
    """(status, the answer without what is made anew); a refusal is compared as vLLM's JSON."""
    if response.status_code != 200 or not stream:
        return response.status_code, fresh(response.json())
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return 200, said([fresh(json.loads(line[6:])) for line in lines[:-1]])
