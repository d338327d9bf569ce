"""The served identity names what generation renders with, over gRPC and HTTP alike.

Issue 13, item 8: with ``--chat-template`` GetTokenizerInfo reported the folder template's
``chat_template_sha256`` (it read a ``chat_template`` key nothing wrote) while /tokenizer_info
reported the override. Both now read :attr:`ServedModel.chat_template`.
"""

from __future__ import annotations

import hashlib

import httpx
import pytest

from tokenkeys.client import TokenizerClient
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions

from http_support import HttpServerThread

# A server-wide template unlike the folder's.
OVERRIDE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("override", [None, OVERRIDE, "default"], ids=["folder", "text", "name"])
def test_identity_names_the_template_generation_renders_with(grpc_server, override) -> None:
    chat = ChatOptions(chat_template=override)
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits(), chat)
    model = models.get(None)
    folder = model.tokenizer.chat_templates["default"]
    rendered = model.preprocessor.chat.prepare({"messages": [{"role": "user", "content": "hi"}]})
    assert rendered.template == (OVERRIDE if override == OVERRIDE else folder)
    with TokenizerClient(grpc_server(models).target) as client:
        info = client.info()
    assert info.chat_template_sha256 == _sha(rendered.template)
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url) as http:
        assert http.get("/tokenizer_info").json()["chat_template"] == rendered.template
