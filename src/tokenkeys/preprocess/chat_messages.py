"""Turn OpenAI chat messages into the conversation a chat template sees, as vLLM does.

Matched against vLLM's ``vllm/entrypoints/chat_utils.py`` (0.33-era ``main``:
``_parse_chat_message_content``, ``_parse_chat_message_content_part``,
``_postprocess_messages``) and the ``ChatCompletionRequest`` validator that renames
``reasoning_content`` to ``reasoning``:

- content given as a string is one text part; null or missing content is no parts;
- with the ``"string"`` content format the texts of the parts are joined with ``"\\n"``; with
  ``"openai"`` they stay a list of ``{"type": "text", "text": ...}`` parts (see
  :mod:`tokenkeys.template.syntax` for how the format is detected);
- text parts are ``text``, ``input_text``, ``output_text``, ``refusal`` and ``thinking`` (a
  ``text`` or ``refusal`` part without its text is skipped), plain strings, and
  ``tool_reference`` (its name);
- image parts (``image_url``, ``input_image``) of a model whose images are served become
  ``{"type": "image"}`` parts (``"openai"`` format) or its placeholder text, the missing ones
  put in front of the joined texts (``"string"`` format, vLLM's
  ``_get_full_multimodal_text_prompt``), and are collected in prompt order
  (:class:`~tokenkeys.preprocess.images.ImageRef`) for the expansion; audio and video raise
  :class:`~tokenkeys.errors.Unsupported` naming the modality, other media parts (files,
  embeddings, and images of a text-only model) too;
- the kept keys are role and content, then ``tool_calls`` and ``reasoning`` (copied to
  ``reasoning_content``) for assistants, ``tool_call_id`` for tools, ``name`` and ``task`` when
  strings, ``tools`` for developer messages; every other key is dropped;
- tool messages whose content is a list of text parts get the parts joined with ``"\\n"``;
- assistant ``tool_calls``: an empty list is removed, and each ``function.arguments`` JSON
  string is parsed into an object (``{}`` when it is not valid JSON or not a string/object/list),
  which is what tool-calling templates expect.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument, Unsupported
from tokenkeys.preprocess.images import ImageRef
from tokenkeys.template.syntax import ContentFormat

# Part types that carry text, and the key holding it (vLLM MM_PARSER_MAP).
_TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# Parts skipped (not refused) when their text is missing (vLLM PART_TYPES_TO_SKIP_NONE_CONTENT).
_SKIPPED_WHEN_EMPTY = frozenset({"text", "refusal"})
# Media part types: vLLM's multimodal parsers, plus the OpenAI file part and the bare
# image/audio/video parts of transformers-style conversations.
MEDIA_PART_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image_pil",
        "image_embeds",
        "audio_url",
        "input_audio",
        "audio_embeds",
        "video_url",
        "prompt_embeds",
        "file",
        "input_file",
        "image",
        "audio",
        "video",
    }
)
# Keys by which vLLM recognises a media part that has no "type".
_MEDIA_KEYS = (
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "prompt_embeds",
    "audio_url",
    "input_audio",
    "video_url",
)
_KNOWN_PART_TYPES = sorted({*_TEXT_PART_KEYS, *MEDIA_PART_TYPES, "tool_reference"})
#: Image parts: served when the model's processor is reproduced; a text-only model refuses
#: them as vLLM 0.32 does, with 400 "<model> is not a multimodal model" before fetching anything
#: (``vllm/renderers/chat_utils.py`` ``AsyncMultiModalContentParser.parse_image`` adds the item
#: to its tracker, whose processor ``MultiModalRegistry.create_processor`` refuses).
IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})
#: The modality a media part carries, for the 501 that names it.
_MODALITY = {
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "audio": "audio",
    "video_url": "video",
    "video": "video",
}


class ImageParts:
    """The image parts of one conversation, in order, and the placeholder text they render as."""

    def __init__(self, placeholder: str) -> None:
        self.placeholder = placeholder
        self.refs: list[ImageRef] = []


def modality_reason(kind: str, where: str) -> str | None:
    """Why an audio or video part is refused (naming the modality), None for other kinds."""
    modality = _MODALITY.get(kind)
    if modality is None:
        return None
    return (
        f"{modality} input is not supported ({kind!r} at {where}): only images are expanded "
        "exactly here"
    )


def _image_ref(part: Mapping[str, Any], kind: str, where: str) -> ImageRef:
    value = part.get(kind)
    # vLLM: image_url is {"url": ...}; input_image (Responses) carries the URL string itself.
    url = value.get("url") if kind == "image_url" and isinstance(value, Mapping) else value
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"{where}.{kind} must carry a URL string", field=f"{where}.{kind}")
    uuid = part.get("uuid")
    return ImageRef(url, None if uuid is None else str(uuid), f"{where}.{kind}")


def media_kind(part: Any) -> str | None:
    """The media type of a content part (``"image_url"``, ...), or None for anything else."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if isinstance(kind, str) and kind in MEDIA_PART_TYPES:
        return kind
    if kind is None or part.get("uuid") is not None:
        for key in _MEDIA_KEYS:
            if key == "input_audio":
                if part.get(key) is not None:
                    return key
            elif key in part:
                return key
    return None


def _unsupported_media(kind: str, where: str) -> Unsupported:
    return Unsupported(
        f"content part type {kind!r} at {where} is not supported: this deployment renders "
        "text-only chats and cannot reproduce the engine's multimodal placeholder expansion "
        "exactly; send text parts only",
        field=where,
    )


def _part(part: Any, where: str, images: ImageParts | None) -> tuple[str, str] | None:
    """One content part as (kind, text), kind "text", "tool_reference" or "image"; None to skip."""
    if isinstance(part, str):
        return ("text", part)
    if not isinstance(part, Mapping):
        raise InvalidArgument(
            f"{where} must be a string or an object, got {type(part).__name__}", field=where
        )
    kind = media_kind(part)
    if kind is not None:
        if images is not None and kind in IMAGE_PART_TYPES:
            images.refs.append(_image_ref(part, kind, where))
            return ("image", images.placeholder)
        # An image part without ImageParts is not reached from the Preprocessor: a text-only
        # model's images get vLLM's 400 before rendering (Preprocessor.tokenize_chat), a
        # processor it cannot reproduce its 501 naming the class.
        reason = modality_reason(kind, where)
        if reason is not None:
            raise Unsupported(reason, field=where)
        raise _unsupported_media(kind, where)
    part_type = part.get("type")
    if part_type is None or part.get("uuid") is not None:
        if "tool_reference" in part:
            part_type = "tool_reference"
        else:
            raise InvalidArgument(
                f"{where} has no 'type'; give each content part a type such as 'text'",
                field=where,
            )
    if not isinstance(part_type, str):
        raise InvalidArgument(f"{where}.type must be a string", field=where)
    if part_type == "tool_reference":
        name = part.get("name")
        if not isinstance(name, str):
            raise InvalidArgument(f"{where}.name must be a string", field=where)
        return ("tool_reference", name)
    key = _TEXT_PART_KEYS.get(part_type)
    if key is None:
        raise InvalidArgument(
            f"{where}.type {part_type!r} is not a known content part type; known: "
            f"{', '.join(_KNOWN_PART_TYPES)}",
            field=where,
        )
    text = part.get(key)
    if text is None and part_type in _SKIPPED_WHEN_EMPTY:
        return None
    if not isinstance(text, str):
        raise InvalidArgument(
            f"{where}.{key} must be a string, got {type(text).__name__}", field=where
        )
    return ("text", text)


def _content(
    content: Any, fmt: ContentFormat, where: str, images: ImageParts | None = None
) -> str | list[dict[str, str]]:
    if content is None:
        raw: list[Any] = []
    elif isinstance(content, str):
        raw = [content]
    elif isinstance(content, list):
        raw = content
    else:
        raise InvalidArgument(
            f"{where} must be a string, a list of content parts or null, got "
            f"{type(content).__name__}",
            field=where,
        )
    parts = [
        p for i, item in enumerate(raw) if (p := _part(item, f"{where}[{i}]", images)) is not None
    ]
    if fmt == "string":
        text = "\n".join(text for kind, text in parts if kind != "image")
        placeholders = [text for kind, text in parts if kind == "image"]
        return _with_placeholders(text, placeholders, where) if placeholders else text
    return [
        {"type": "tool_reference", "name": text}
        if kind == "tool_reference"
        else {"type": "image"}
        if kind == "image"
        else {"type": "text", "text": text}
        for kind, text in parts
    ]


def _with_placeholders(text: str, placeholders: list[str], where: str) -> str:
    """vLLM's string-format prompt: placeholders the text lacks go in front, one per line."""
    missing = len(placeholders) - text.count(placeholders[0])
    if missing < 0:
        raise InvalidArgument(
            f"Found more '{placeholders[0]}' placeholders in input prompt than actual "
            "multimodal data items.",
            field=where,
        )
    return "\n".join([placeholders[0]] * missing + ([text] if text else []))


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{where} must be a list of tool calls", field=where)
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidArgument(
                f"{where}[{i}] must be an object with function.name (a string) and "
                "function.arguments",
                field=where,
            )
        call = copy.deepcopy(dict(call))
        call["function"] = dict(call["function"])
        arguments = call["function"].get("arguments")
        if isinstance(arguments, str):
            # vLLM parses the OpenAI JSON string for templates, and uses {} when it is invalid.
            try:
                call["function"]["arguments"] = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                call["function"]["arguments"] = {}
        elif not isinstance(arguments, (dict, list)):
            call["function"]["arguments"] = {}
        calls.append(call)
    return calls


def _message(
    message: Any, fmt: ContentFormat, where: str, images: ImageParts | None
) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise InvalidArgument(
            f"{where} must be an object, got {type(message).__name__}", field=where
        )
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidArgument(f"{where}.role must be a string", field=f"{where}.role")
    reasoning = message.get("reasoning")
    if reasoning is None:
        # The chat request validator renames the deprecated field before parsing.
        reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise InvalidArgument(f"{where}.reasoning must be a string", field=where)
    out: dict[str, Any] = {
        "role": role,
        "content": _content(message.get("content"), fmt, f"{where}.content", images),
    }
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
            if calls:
                out["tool_calls"] = calls
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        content = out["content"]
        if isinstance(content, list) and all(p["type"] == "text" for p in content):
            out["content"] = "\n".join(p["text"] for p in content)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = copy.deepcopy(message.get("tools"))
    return out


def normalize_messages(
    messages: Any, content_format: ContentFormat, images: ImageParts | None = None
) -> list[dict[str, Any]]:
    """Build the template's conversation from request messages (see the module docstring).

    ``images`` collects the image parts of a model whose images are served; without it they are
    refused.
    """
    if not isinstance(messages, list):
        raise InvalidArgument(
            f"messages must be a list of messages, got {type(messages).__name__}",
            field="messages",
        )
    return [_message(m, content_format, f"messages[{i}]", images) for i, m in enumerate(messages)]
