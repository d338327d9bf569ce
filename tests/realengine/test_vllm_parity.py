"""Acceptance (issue 34): ``tokenkeys parity`` against a real vLLM 0.32, the engine as judge.

- Against ``vllm serve`` in its default configuration (shared with the other modules): every
  built-in shape is certified. ``vllm serve`` answers the render routes 403 without
  ``--enable-scale-out``, so chat and completions are counted by its ``/tokenize`` and Messages
  and Responses by its ``/tokenize`` of tokenkeys' conversion together with vLLM's own count of
  the request as sent (``/v1/messages/count_tokens``, a one-token ``/v1/responses``' usage).
- Against a ``vllm serve --chat-template`` of another template (SmolLM2's ChatML without its
  default system message): the shapes that bring their own system message (or instructions)
  and the completions are certified, every other conversation differs, named with its first
  differing token; told the same template (``--chat-template``), parity certifies them again.
  That vLLM is the one ``test_vllm_explain.py`` restarts with the other template for its last
  test, which runs :func:`assert_another_template_differs` on it: no server of its own.

The render routes' exact ids (``vllm launch render``) are checked by parity in
``test_vllm_render.py``, where that server runs.
"""

from __future__ import annotations

import json

import pytest

from tokenkeys.parity.corpus import BUILT_IN

from support import run_cli
from vllm_server import DEFAULT_CONFIG, OTHER_CHAT_TEMPLATE

pytestmark = pytest.mark.realengine

#: The built-in shapes that carry a system message (or instructions) of their own, which the
#: other template renders as the model's own does.
WITH_SYSTEM = {"chat-system", "messages-system-blocks", "responses-instructions"}


def parity(url: str, *extra: str) -> tuple[int, dict]:
    """``tokenkeys parity --json`` against ``url`` with vLLM's tokenizer backend."""
    done = run_cli(
        "parity", "--engine", url, "--backend", "transformers5", "--json", "--timeout", "120",
        *extra, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.mark.vllm_servers(DEFAULT_CONFIG)
def test_every_built_in_shape_is_certified_against_vllm(vllm_pool) -> None:
    code, report = parity(vllm_pool.get(DEFAULT_CONFIG).url)
    shapes = {s["name"]: s for s in report["shapes"]}
    assert set(shapes) == {s.name for s in BUILT_IN}
    for shape in shapes.values():
        assert shape["status"] == "certified", shape
        assert shape["source"].endswith("/render answered 403)"), shape
    assert code == 0


def assert_another_template_differs(url: str) -> None:
    """``tokenkeys parity`` against the vLLM at ``url``, started with ``--chat-template``
    :data:`OTHER_CHAT_TEMPLATE`, names the shapes that differ and their first differing token,
    and certifies every shape once told that template."""
    code, report = parity(url)
    assert code == 1
    shapes = {s["name"]: s for s in report["shapes"]}
    differ = {n for n, s in shapes.items() if s["status"] == "differs"}
    certified = {n for n, s in shapes.items() if s["status"] == "certified"}
    assert WITH_SYSTEM | {s.name for s in BUILT_IN if s.route == "completions"} <= certified
    assert "chat-plain" in differ
    for name in differ:
        shape = shapes[name]
        assert shape["engine"]["ids"] != shape["tokenkeys"]["ids"], shape
        assert shape["index"] < shape["engine_tokens"] or shape["index"] < shape["tokenkeys_tokens"]
        assert shape["likely_cause"].startswith("likely: "), shape
    # The first differing token of a conversation without a system message: the default system
    # prompt SmolLM2's own template opens with, which the other template leaves out.
    plain = shapes["chat-plain"]
    assert (
        plain["likely_cause"] == "likely: the template prologue (a default system prompt or header)"
    )
    assert "system" in "".join(plain["tokenkeys"]["text"])
    # Told the engine's template, tokenkeys renders what it renders.
    code, report = parity(url, "--chat-template", OTHER_CHAT_TEMPLATE)
    rest = [s for s in report["shapes"] if s["status"] != "certified"]
    assert code == 0 and not rest, rest
