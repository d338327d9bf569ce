"""The chat prologue: from a chat request to the prompt text, shared by every path.

Generation (/v1/chat/completions, Generate) and counting (/tokenize, gRPC Tokenize) both call
:meth:`ChatPrologue.prepare` then :meth:`ChatPrologue.render`, so a chat is rendered one way.
The request is the JSON object a client sent (absent fields take vLLM's defaults). The steps
follow vLLM's chat path (0.33-era ``main``: ``ChatCompletionRequest.build_chat_params``,
``ChatParams.with_defaults``, ``OnlineRenderer.render_chat``, ``resolve_chat_template_kwargs``):

1. :func:`unsupported_reason` — anything rendered here could not match the engine exactly
   (media parts, ``mm_processor_kwargs``, ``media_io_kwargs``, tokenizer options smuggled in
   ``chat_template_kwargs``) is refused with :class:`~tokenkeys.errors.Unsupported`.
2. A request ``chat_template`` (or ``chat_template_kwargs.chat_template``) needs
   ``trust_request_chat_template``; otherwise 400, as in vLLM.
3. Template variables: the request's ``chat_template_kwargs``, overridden by the request fields
   ``add_generation_prompt``, ``continue_final_message``, ``documents`` and
   ``reasoning_effort`` (which also sets ``enable_thinking`` unless the kwargs do), all laid
   over the server's ``default_chat_template_kwargs``; a null or ``"auto"`` value never
   overrides. Only names the template reads are kept.
4. Tools are normalized by :func:`~tokenkeys.preprocess.chat_tools.normalize_tools`;
   ``tool_choice: "none"`` drops them only with ``exclude_tools_when_tool_choice_none``.
5. The template is chosen by :func:`~tokenkeys.tokenizer.chat_template_select.select_template`,
   messages are normalized by :func:`~tokenkeys.preprocess.chat_messages.normalize_messages` for the
   template's content format, and the result is a frozen :class:`ChatRender`.

One deliberate difference from vLLM: vLLM's /tokenize ignores ``documents``,
``reasoning_effort`` and ``tool_choice`` while its chat completions honour them; here both
honour them, because a count must equal what generation would use.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from tokenkeys.errors import (
    ConfigError,
    InvalidArgument,
    LimitExceeded,
    TokenkeysError,
    Unsupported,
    vllm_invalid,
)
from tokenkeys.preprocess.chat_messages import (
    IMAGE_PART_TYPES,
    ImageParts,
    media_kind,
    modality_reason,
    normalize_messages,
)
from tokenkeys.preprocess.chat_request import (
    COLLIDING_KWARGS,
    freeze,
    prompt_flags,
    request_tools,
    requested_template,
    template_kwargs,
    thaw,
)
from tokenkeys.preprocess.chat_schema import check_chat_request
from tokenkeys.preprocess.images import ImageRef
from tokenkeys.preprocess.prompt_options import shared_prompt_reason
from tokenkeys.template.render import ChatTemplateRenderer, RenderLimits
from tokenkeys.tokenizer.chat_template_select import select_template

# transformers' apply_chat_template parameters that change tokenization, with their defaults.
# vLLM forwards chat_template_kwargs with these names to apply_chat_template, where they pad,
# truncate or re-encode; a non-default value is refused rather than ignored.
TOKENIZATION_KWARGS: Mapping[str, Any] = MappingProxyType(
    {
        "padding": False,
        "truncation": False,
        "max_length": None,
        "return_tensors": None,
        "return_assistant_tokens_mask": False,
        "tokenizer_kwargs": None,
        "sanitize_control_tokens": False,
    }
)
ContentFormatOption = Literal["auto", "string", "openai"]


def _kwargs_problem(kwargs: Mapping[str, Any], where: str) -> str | None:
    for name, default in TOKENIZATION_KWARGS.items():
        if name in kwargs and kwargs[name] != default:
            return (
                f"{where}.{name} is a tokenizer option of transformers' apply_chat_template; "
                "this deployment does not apply it to chat prompts, so the count would not be "
                f"the engine's; remove {name}"
            )
    return None


def unsupported_reason(request: Mapping[str, Any], *, images: bool = False) -> str | None:
    """Why this chat request cannot be rendered exactly here, or None when it can.

    Both the generation path and the counting path consult it, so neither approximates:
    ``mm_processor_kwargs`` and ``media_io_kwargs`` (no multimodal processor runs here),
    media content parts (placeholder expansion is the engine's), tokenizer options inside
    ``chat_template_kwargs``, and the prompt-changing fields both request forms share
    (:func:`~tokenkeys.preprocess.prompt_options.shared_prompt_reason`). Malformed fields are
    not judged here (``prepare`` reports them). With ``images`` (the model's image processor is
    reproduced) image parts pass; audio and video are refused naming the modality.
    """
    shared = shared_prompt_reason(request)
    if shared is not None:
        return shared
    if request.get("prompt_token_ids") is not None:
        # vLLM 0.32 ignores this field in a chat request (an unknown field, logged at debug
        # level) and renders the messages; a client sending it means the ids to be served.
        return (
            "prompt_token_ids is not a chat request field: vLLM 0.32 ignores it and renders "
            "the messages; send the ids as kv_transfer_params.prompt_token_ids (vLLM's "
            "token-in chat) or to /v1/completions as prompt"
        )
    for key in ("mm_processor_kwargs", "media_io_kwargs"):
        if request.get(key):
            return (
                f"{key} is not supported: this deployment renders text-only chats and runs no "
                f"multimodal processor; remove {key}"
            )
    kwargs = request.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping):
        problem = _kwargs_problem(kwargs, "chat_template_kwargs")
        if problem:
            return problem
    messages = request.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list):
                for j, part in enumerate(content):
                    kind = media_kind(part)
                    if kind is not None and images and kind in IMAGE_PART_TYPES:
                        continue
                    if kind is not None and (
                        reason := modality_reason(kind, f"messages[{i}].content[{j}]")
                    ):
                        return reason
                    if kind is not None:
                        return (
                            f"content part type {kind!r} at messages[{i}].content[{j}] is not "
                            "supported: this deployment renders text-only chats and cannot "
                            "reproduce the engine's multimodal placeholder expansion exactly; "
                            "send text parts only"
                        )
    return None


REUSED_IDS_FIELD = "kv_transfer_params.prompt_token_ids"


def reused_prompt_ids(request: Mapping[str, Any]) -> list[int] | None:
    """The ids a chat request carries instead of a rendering, or None to render it.

    vLLM 0.32's token-in chat (``vllm/renderers/online_renderer.py``
    ``_reused_prompt_token_ids``): ``kv_transfer_params.prompt_token_ids`` replaces templating
    and tokenization, unless ``echo`` is set (the messages are then rendered). The ids must be
    a non-empty list of non-negative integers (booleans are not integers), else 400 with
    vLLM's message; the vocabulary check is the caller's. Media content would also make vLLM
    render, but media is refused before this (:func:`unsupported_reason`).
    """
    kv = request.get("kv_transfer_params")
    if not isinstance(kv, Mapping):
        return None
    ids = kv.get("prompt_token_ids")
    if ids is None or request.get("echo"):
        return None
    if (
        not isinstance(ids, list) or not ids or any(type(i) is not int or i < 0 for i in ids)  # noqa: E721 - bool is no id
    ):
        raise vllm_invalid(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of "
            "non-negative integers.",
            REUSED_IDS_FIELD,
        )
    return list(ids)


@dataclass(frozen=True)
class ChatOptions:
    """Server-side chat settings (vLLM's flags of the same names).

    ``chat_template`` is the ``--chat-template`` text (or the name of one of the tokenizer's
    templates); ``content_format`` is ``--chat-template-content-format``.
    """

    chat_template: str | None = None
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    trust_request_chat_template: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    content_format: ContentFormatOption = "auto"
    limits: RenderLimits = field(default_factory=RenderLimits)

    def __post_init__(self) -> None:
        defaults = self.default_chat_template_kwargs
        if not isinstance(defaults, Mapping) or not all(isinstance(k, str) for k in defaults):
            raise ConfigError(
                "default_chat_template_kwargs must be a JSON object with string keys",
                field="default_chat_template_kwargs",
            )
        bad = sorted((COLLIDING_KWARGS | {"chat_template"}) & defaults.keys())
        if bad:
            raise ConfigError(
                f"default_chat_template_kwargs may not set {', '.join(bad)}",
                field="default_chat_template_kwargs",
            )
        problem = _kwargs_problem(defaults, "default_chat_template_kwargs")
        if problem:
            raise ConfigError(problem, field="default_chat_template_kwargs")
        if self.content_format not in ("auto", "string", "openai"):
            raise ConfigError(
                f"content_format must be auto, string or openai, got {self.content_format!r}",
                field="content_format",
            )
        object.__setattr__(self, "default_chat_template_kwargs", freeze(defaults))


@dataclass(frozen=True)
class ChatRender:
    """Everything one chat render depends on, frozen: same value, same prompt text."""

    template: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    documents: tuple[Mapping[str, Any], ...] | None
    variables: Mapping[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool
    images: tuple[ImageRef, ...] = ()


class ChatPrologue:
    """The one chat path of a served model: request → :class:`ChatRender` → prompt text.

    ``templates`` are the tokenizer's named chat templates (``{"default": text}`` for one),
    ``special_tokens`` transformers' ``special_tokens_map`` (``bos_token``, ``eos_token``, ...,
    named tokens only, as transformers 5 passes them). Compiled templates are cached.
    ``image_placeholder`` is the placeholder text of a model whose images are served (its
    processor's), None for text only.
    """

    def __init__(
        self,
        templates: Mapping[str, str],
        special_tokens: Mapping[str, str],
        options: ChatOptions | None = None,
        *,
        clock: Callable[[], datetime] = datetime.now,
        cache_size: int = 32,
        image_placeholder: str | None = None,
    ) -> None:
        self.image_placeholder = image_placeholder
        self.templates = MappingProxyType(dict(templates))
        self.special_tokens = MappingProxyType(dict(special_tokens))
        self.options = options or ChatOptions()
        self._clock = clock
        self._cache: OrderedDict[str, ChatTemplateRenderer] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        server = self.options.chat_template
        if server is not None and server not in self.templates:
            try:
                self._check_server_template(self.renderer(server))
            except TokenkeysError as exc:
                raise ConfigError(f"--chat-template: {exc.message}", field="chat_template") from exc

    @property
    def served_template(self) -> str | None:
        """The template a request without tools or a template of its own renders with.

        What the served identity reports (HTTP /tokenizer_info, gRPC GetTokenizerInfo): the
        ``--chat-template`` override (a text, or the name of a named template) when given.
        """
        name = self.options.chat_template
        if name is not None:
            return self.templates.get(name, name)
        return self.templates.get("default")

    def _check_server_template(self, renderer: ChatTemplateRenderer) -> None:
        """Refuse a hostile server template at start rather than on every request.

        Hostile: it reads interpreter internals, or rendering a one-message conversation is
        stopped by the sandbox, recurses without end, or goes past a render limit. A template
        that merely rejects the sample (``raise_exception`` about roles, an undefined
        variable) is left to fail per request, as it would in vLLM.
        """
        if renderer.hostile:
            raise InvalidArgument(
                "the template reads interpreter internals, which only a hostile template does ("
                + "; ".join(renderer.hostile[:5])
                + "); the sandbox would refuse every request: fix the template",
                field="chat_template",
            )
        sample = [{"role": "user", "content": "Hello"}]
        try:
            renderer.render(sample, add_generation_prompt=True, special_tokens=self.special_tokens)
        except LimitExceeded as exc:
            raise InvalidArgument(
                f"rendering a one-message conversation goes past a render limit: {exc.message}",
                field="chat_template",
            ) from exc
        except InvalidArgument as exc:
            if exc.details.get("kind") in ("sandbox", "recursion"):
                raise InvalidArgument(
                    f"rendering a one-message conversation fails: {exc.message}",
                    field="chat_template",
                ) from exc

    def renderer(self, template: str) -> ChatTemplateRenderer:
        """The compiled renderer of a template text (compiled once, then cached)."""
        with self._lock:
            found = self._cache.get(template)
            if found is not None:
                self._cache.move_to_end(template)
                return found
        compiled = ChatTemplateRenderer(template, limits=self.options.limits, clock=self._clock)
        with self._lock:
            self._cache[template] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def prepare(self, request: Mapping[str, Any]) -> ChatRender:
        """Validate and normalize a chat request (see the module docstring for the steps)."""
        if not isinstance(request, Mapping):
            raise InvalidArgument("the request body must be a JSON object", field="body")
        # vLLM's request validators run before anything is rendered (400s first).
        check_chat_request(request)
        reason = unsupported_reason(request, images=self.image_placeholder is not None)
        if reason is not None:
            raise Unsupported(reason)
        flags = prompt_flags(request)
        requested = requested_template(request, self.options.trust_request_chat_template)
        kwargs = template_kwargs(request, self.options.default_chat_template_kwargs, flags)
        tools = request_tools(request, self.options.exclude_tools_when_tool_choice_none)
        name = requested or self.options.chat_template or kwargs.template
        template = select_template(self.templates, tools is not None, name)
        renderer = self.renderer(template)
        fmt = self.options.content_format
        content_format = renderer.content_format if fmt == "auto" else fmt
        parts = None if self.image_placeholder is None else ImageParts(self.image_placeholder)
        messages = normalize_messages(request.get("messages"), content_format, parts)
        variables = {
            k: v
            for k, v in kwargs.variables.items()
            if k in renderer.variables and k not in TOKENIZATION_KWARGS and k != "return_dict"
        }
        return ChatRender(
            template=template,
            messages=freeze(messages),
            tools=freeze(tools),
            documents=freeze(kwargs.documents),
            variables=freeze(variables),
            add_generation_prompt=flags.add_generation_prompt,
            continue_final_message=flags.continue_final_message,
            images=tuple(parts.refs) if parts is not None else (),
        )

    def render(self, chat: ChatRender) -> str:
        """Render a prepared chat to prompt text (pure given the clock for ``strftime_now``)."""
        return self.renderer(chat.template).render(
            thaw(chat.messages),
            tools=thaw(chat.tools),
            documents=thaw(chat.documents),
            add_generation_prompt=chat.add_generation_prompt,
            continue_final_message=chat.continue_final_message,
            special_tokens=self.special_tokens,
            variables=thaw(chat.variables),
        )
