"""The OpenAI answer shapes of the two generation routes, whole and streamed.

Completions answer ``text_completion`` objects with one choice per prompt; chat answers
``chat.completion`` with a ``message``, or ``chat.completion.chunk`` events whose first delta
carries the role. With ``stream_options.include_usage`` every chunk has ``usage: null`` and a
last chunk with no choices carries the usage (OpenAI's documented stream contract).

With ``return_token_ids`` the prompt ids are placed where vLLM 0.32 places them
(``vllm/entrypoints/openai/completion/serving.py`` and ``chat_completion/serving.py``): on each
completion choice (``choices[i].prompt_token_ids``, and in a stream on the first chunk of each
choice), at the top of a chat answer (in a stream, on its first chunk, the one with the role);
each choice or chunk also carries its generated ``token_ids``. ``return_prompt_text`` adds the
rendered chat prompt as ``prompt_text`` (first chunk in streams), and the answer id is
``cmpl-``/``chatcmpl-`` followed by the request's ``X-Request-Id`` header, else its
``request_id``, else a random id, as in vLLM 0.32.

Keys are sent as vLLM 0.32 sends them: a whole answer is its response model dumped in full
(``model_dump()``: every field, ``null`` when unset, so ``prompt_token_ids`` and ``token_ids``
are ``null`` without ``return_token_ids``; a chat message's empty ``tool_calls`` is dropped by
its serializer), a chunk holds the fields its handler sets (``model_dump_json(exclude_unset=
True)``), so a completion chunk always carries ``prompt_token_ids``/``token_ids`` and a chat
delta its ``token_ids``. The official ``openai`` client reads these as attributes and needs them
present.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """Identity of one answer: id, creation time and model, shared by all its chunks."""

    prefix: str
    model: str
    include_usage: bool = False
    return_token_ids: bool = False
    #: The request's id (X-Request-Id, else the body's request_id); None: a random one.
    request_id: str | None = None
    #: With return_prompt_text (chat): the rendered prompt, null for a token-in chat.
    prompt_text: str | None = None
    return_prompt_text: bool = False
    id: str = field(init=False)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        # vLLM 0.32: f"cmpl-{request_id}" / f"chatcmpl-{request_id}" (_base_request_id).
        self.id = f"{self.prefix}-{self.request_id or uuid.uuid4().hex}"

    def _head(self, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
        }
        return out

    def _ids(self, ids: list[int] | None) -> list[int] | None:
        """``ids`` with ``return_token_ids``, else null (vLLM sets the key either way)."""
        return ids if self.return_token_ids else None

    def _chunk(self, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        out = self._head(kind)
        out["choices"] = [choice]
        if self.include_usage:
            out["usage"] = None
        return out

    CHUNK = "chunk"

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The last chunk of a stream with ``include_usage``: no choices, the usage."""
        out = self._head(self.CHUNK)
        out["choices"] = []
        out["usage"] = usage
        return out


class CompletionShape(Answer):
    """``/v1/completions`` answers."""

    PREFIX = "cmpl"
    KIND = "text_completion"
    CHUNK = "text_completion"

    def choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        token_ids: list[int] | None,
        prompt_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        """A streamed choice; ``prompt_ids`` are its prompt's ids (on its first chunk)."""
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": self._ids(prompt_ids),
            "token_ids": self._ids(token_ids),
        }

    def whole_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        token_ids: list[int],
        prompt_ids: list[int],
    ) -> dict[str, Any]:
        """One choice of a whole answer (vLLM's ``CompletionResponseChoice``, every field)."""
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": self._ids(token_ids),
            "prompt_logprobs": None,
            "prompt_token_ids": self._ids(prompt_ids),
            "routed_experts": None,
        }

    def whole(self, choices: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
        out = self._head(self.KIND)
        out["choices"] = choices
        out.update(service_tier=None, system_fingerprint=None, usage=usage)
        out.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return out

    def chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        token_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        choice = self.choice(index, text, finish_reason, token_ids, prompt_ids)
        return self._chunk(self.CHUNK, choice)

    def opening(self, index: int, prompt_ids: list[int]) -> dict[str, Any] | None:
        """Completions streams have no opening chunk."""
        return None


class ChatShape(Answer):
    """``/v1/chat/completions`` answers."""

    PREFIX = "chatcmpl"
    KIND = "chat.completion"
    CHUNK = "chat.completion.chunk"

    def whole(
        self,
        text: str,
        finish_reason: str | None,
        usage: dict[str, Any],
        prompt_ids: list[int],
        token_ids: list[int],
    ) -> dict[str, Any]:
        # vLLM's ChatMessage serializer drops an empty tool_calls.
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None}
        message.update(audio=None, function_call=None, reasoning=None)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": self._ids(token_ids),
            "routed_experts": None,
        }
        out = self._head(self.KIND)
        out["choices"] = [choice]
        out.update(service_tier=None, system_fingerprint=None, usage=usage, prompt_logprobs=None)
        out["prompt_token_ids"] = self._ids(prompt_ids)
        out["prompt_text"] = self.prompt_text if self.return_prompt_text else None
        out.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return out

    def opening(self, index: int, prompt_ids: list[int]) -> dict[str, Any] | None:
        """The first chunk: the assistant role and empty content, as OpenAI sends it, and the
        prompt ids with ``return_token_ids``."""
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        out = self._chunk(self.CHUNK, choice)
        out["prompt_token_ids"] = self._ids(prompt_ids)
        out["prompt_text"] = self.prompt_text if self.return_prompt_text else None
        return out

    def chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        token_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        """A delta chunk; chat streams send the prompt ids in the opening chunk instead."""
        choice: dict[str, Any] = {
            "index": index,
            "delta": {"content": text} if text or finish_reason is None else {},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = self._ids(token_ids)
        return self._chunk(self.CHUNK, choice)
