"""Conversations shared by the transformers parity suites (renderer alone, and over HTTP)."""

from __future__ import annotations

import copy
import json

# Tokenizers in tests/data/tokenizers that ship a chat template.
CHAT_MODELS = ("smollm2-135m-instruct", "qwen2.5-instruct", "phi-3-mini")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — 天気",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Ville, e.g. Zürich"}},
                "required": ["city"],
            },
        },
    }
]

TOOL_CONVERSATION = [
    {"role": "user", "content": "Quel temps fait-il à Zürich? 🌦"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": "12°C", "ciel": "nuageux"}'},
    {"role": "assistant", "content": "Il fait 12°C ☁️"},
    {"role": "user", "content": "Et à 東京?"},
]


def openai_form(conversation: list[dict]) -> list[dict]:
    """The conversation as an OpenAI client sends it: tool-call arguments as JSON text.

    vLLM 0.32 refuses arguments given as an object (400) and parses the text into the object
    transformers' templates read, so an HTTP request carries this form and the transformers
    reference the object form.
    """
    out = copy.deepcopy(conversation)
    for message in out:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    return out
