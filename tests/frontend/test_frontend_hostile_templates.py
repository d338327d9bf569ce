"""Hostile chat templates end to end over HTTP: each is refused (400 naming chat_template) or
bounded, and the server keeps serving. Server-side templates that are hostile are refused at
start. Escapes match what sandbox escapes published against jinja2 and transformers reach for
(attribute walks to ``__globals__``/``__subclasses__``, format-string attribute access, loaders),
plus resource exhaustion (huge values, deep recursion, endless loops)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from served import Served

from tokenkeys.errors import ConfigError
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.template.render import RenderLimits
from tokenkeys.tokenizer import TokenizerOptions

from http_support import HttpServerThread, registry
from support import run_cli

MESSAGES = [{"role": "user", "content": "hi"}]
LIMITS = RenderLimits(max_output_chars=100_000, max_built_chars=2_000_000, max_render_seconds=2)

REFUSED = {
    # attribute escapes
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ raise_exception.__globals__ }}",
    "cycler": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "joiner": "{{ joiner.__init__.__globals__ }}",
    "namespace": "{{ namespace.__init__.__globals__['sys'] }}",
    "namespace_private": "{% set ns = namespace(_x=1) %}{{ ns }}",
    "lipsum": "{{ lipsum.__globals__['os'].environ }}",
    "attr_filter": "{{ ''|attr('__class__') }}",
    "format_attr": "{{ '{0.__class__.__base__}'.format('') }}",
    "getitem": "{{ ''['__class__'] }}",
    "mutation": "{{ messages.append(1) }}",
    # environment, files, imports
    "include": "{% include '/etc/passwd' %}",
    "import": "{% import 'os' as os %}{{ os }}",
    "extends": "{% extends '/etc/passwd' %}",
    "from_import": "{% from 'os' import system %}{{ system('id') }}",
    # resources
    "range": "{% for i in range(10**9) %}{% endfor %}",
    "recursion": "{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}",
    "recursion_args": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "megabytes": "{% for i in range(5000) %}{{ 'x' * 1000 }}{% endfor %}",
    "repeat": "{{ 'a' * 10**9 }}",
    "power": "{{ 2 ** 100000000 }}",
    "width": "{{ '%999999999d'|format(1) }}",
    "format_width": "{{ '{:999999999}'.format('') }}",
    "nested_width": "{{ '{0:{1}}'.format('', 999999999) }}",
    "precision": "{{ '%.999999999f' % 1.0 }}",
    "center": "{{ ''|center(999999999) }}",
    "indent": "{{ 'x'|indent(999999999, true) }}",
    "join": "{{ (['x' * 50000] * 100000)|join }}",
    "doubling": "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}"
    "{{ d('ab', 64) }}",
    "macro_output": "{% macro d(n) %}{% if n %}{% set s = d(n - 1) %}{{ s }}{{ s }}"
    "{% else %}x{% endif %}{% endmacro %}{{ d(64) }}",
    "built": "{% set ns = namespace(s='x' * 90000, l=[]) %}{% for i in range(1000) %}"
    "{% set ns.l = ns.l + [ns.s ~ i] %}{% endfor %}",
    "lipsum_size": "{{ lipsum(10**6) }}",
    "time": "{% for i in range(100000) %}{% for j in range(90) %}"
    "{% if messages[0].content %}{% endif %}{% endfor %}{% endfor %}",
}

# Read as empty text, as in transformers: nothing leaks.
BOUNDED = {
    "template_reference": "{{ self._TemplateReference__context }}",
    "undefined_os": "{{ os }}{{ config }}{{ request }}{{ environ }}",
}


@pytest.fixture(scope="module")
def server():
    chat = ChatOptions(trust_request_chat_template=True, limits=LIMITS)
    with HttpServerThread(registry(chat=chat)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _normal_request_succeeds(client: httpx.Client) -> None:
    ok = client.post("/tokenize", json={"messages": MESSAGES})
    assert ok.status_code == 200 and ok.json()["count"] > 0


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hostile_request_templates_are_refused_with_a_clear_400(client, name: str) -> None:
    body = {"messages": MESSAGES, "chat_template": REFUSED[name]}
    response = client.post("/tokenize", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "chat_template" and error["type"] == "BadRequestError"
    assert error["message"].startswith("chat_template")
    _normal_request_succeeds(client)


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_private_and_unknown_names_read_as_nothing(client, name: str) -> None:
    body = {"messages": MESSAGES, "chat_template": BOUNDED[name]}
    response = client.post("/tokenize", json=body)
    assert response.status_code == 200 and response.json()["count"] == 0
    _normal_request_succeeds(client)


def test_generation_refuses_them_too(client) -> None:
    for name in ("recursion", "megabytes", "cycler"):
        body = {"messages": MESSAGES, "chat_template": REFUSED[name], "max_tokens": 1}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
    _normal_request_succeeds(client)


def test_untrusted_servers_refuse_request_templates() -> None:
    with HttpServerThread(registry()) as running:
        body = {"messages": MESSAGES, "chat_template": "{{ 1 }}"}
        response = httpx.post(f"{running.url}/tokenize", json=body)
        assert response.status_code == 400
        assert "--trust-request-chat-template" in response.json()["error"]["message"]


HOSTILE_SERVER_TEMPLATES = {
    "dunder": ("{{ messages.__class__ }}", "interpreter internals"),
    "dunder_string": ("{{ messages|attr('__class__') }}", "interpreter internals"),
    "recursion": ("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", "recursed"),
    "output": ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "character limit"),
    "loop": ("{% for i in range(10**9) %}{% endfor %}", "range"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SERVER_TEMPLATES))
def test_hostile_server_templates_are_refused_at_start(name: str) -> None:
    template, needle = HOSTILE_SERVER_TEMPLATES[name]
    with pytest.raises(ConfigError, match="--chat-template") as info:
        load_models(
            [ModelSource.default()],
            TokenizerOptions(),
            Limits(),
            ChatOptions(chat_template=template, limits=LIMITS),
        )
    assert needle in info.value.message


def test_templates_that_only_reject_the_sample_still_start() -> None:
    picky = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    models = load_models(
        [ModelSource.default()], TokenizerOptions(), Limits(), ChatOptions(chat_template=picky)
    )
    assert models.get(None).preprocessor.chat.options.chat_template == picky


def test_serve_refuses_a_hostile_template_file_at_start(tmp_path: Path) -> None:
    path = tmp_path / "hostile.jinja"
    path.write_text("{{ cycler.__init__.__globals__.os }}", encoding="utf-8")
    result = run_cli(
        "serve",
        "--grpc-port",
        "0",
        "--chat-template",
        str(path),
        "--allowed-template-dir",
        str(tmp_path),
        check=False,
    )
    assert result.returncode == 2
    assert "interpreter internals" in result.stderr and "line 1" in result.stderr


def test_render_limits_are_serve_options() -> None:
    args = ["--trust-request-chat-template", "--chat-template-max-output-chars", "1000"]
    args += ["--chat-template-max-render-seconds", "5"]
    with Served(*args) as served:
        url = f"http://{served.http_address}"
        template = "{% for i in range(30) %}{{ 'x' * 50 }}{% endfor %}"  # 1500 characters
        body = {"messages": MESSAGES, "chat_template": template}
        response = httpx.post(f"{url}/tokenize", json=body)
        assert response.status_code == 400
        assert "1000-character" in response.json()["error"]["message"]
        small = {"messages": MESSAGES, "chat_template": "{{ 'x' * 1000 }}"}
        assert httpx.post(f"{url}/tokenize", json=small).status_code == 200
