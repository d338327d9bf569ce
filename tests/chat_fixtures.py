"""Conversations shared by the parity suites (transformers renderer, HTTP, a real vLLM)."""

from __future__ import annotations

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

# Multilingual conversations: CJK, emoji, accents, ligatures, doubled spaces.
CONVERSATIONS = {
    "cjk_emoji_accents": [
        {"role": "system", "content": "Tu es un assistant précis. 你是一个助手。"},
        {"role": "user", "content": "日本の首都は？ 🗾 Ça va? naïve café"},
        {"role": "assistant", "content": "東京です。🎌 Très bien!"},
        {"role": "user", "content": "한국어도 돼? 👩‍👩‍👧 ﬁn — Ελληνικά  double  spaces"},
    ],
    "no_system": [
        {"role": "user", "content": "Crème brûlée ou 抹茶? 🍮🍵"},
        {"role": "assistant", "content": " Les deux ! "},
        {"role": "user", "content": "Zürich → São Paulo, Ærøskøbing 🚆"},
    ],
}


def openai_form(messages: list[dict]) -> list[dict]:
    """The conversation as an OpenAI client sends it: tool-call arguments as JSON strings.

    (The fixtures hold them as objects, the form chat templates and transformers take.)
    """
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for call in message["tool_calls"]
            ]
        out.append(message)
    return out


def _json(call: dict) -> str:
    return json.dumps(call["function"]["arguments"], ensure_ascii=False)
