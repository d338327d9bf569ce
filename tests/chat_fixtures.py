"""Conversations shared by the transformers parity suites (renderer alone, and over HTTP)."""

from __future__ import annotations

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
