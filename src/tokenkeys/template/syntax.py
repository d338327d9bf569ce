"""What a chat template's syntax tree says about it: its free variables and its content format.

Both answers drive vLLM's request handling, so they are computed the way vLLM computes them
(vLLM ``vllm/renderers/hf.py``: ``_resolve_chat_template_kwargs`` and
``_detect_content_format``, read at the 0.33-era ``main``):

- **free variables** (``jinja2.meta.find_undeclared_variables``): vLLM passes a request's
  ``chat_template_kwargs`` to the template only for names the template reads (or names of
  ``apply_chat_template`` parameters); the others are dropped silently.
- **content format**: ``"openai"`` when the template loops over a message's ``content``
  (``{% for part in message['content'] %}``), where vLLM hands content to the template as a
  list of ``{"type": "text", "text": ...}`` parts; ``"string"`` otherwise, where text parts are
  joined into one string. Detection follows ``messages`` through ``{% set %}`` aliases
  (``loop_messages = messages[1:]``), filters, tests and slices.

It also finds what only a hostile template writes (:func:`hostile_constructs`): reads of dunder
attributes, by name or by string, which the sandbox refuses at render time anyway; a server
refuses such a ``--chat-template`` at start instead of failing every request.
"""

from __future__ import annotations

import re
from typing import Literal

import jinja2.ext
import jinja2.meta
import jinja2.nodes as nodes

from tokenkeys.template.sandbox import ChatSandbox, GenerationTag

ContentFormat = Literal["string", "openai"]


class _Unsupported(Exception):
    """A shape vLLM's detection asserts against (a tuple target); it then falls back."""


def free_variables(source: str) -> frozenset[str]:
    """Names a template reads without defining them, as vLLM computes them.

    vLLM parses with a plain sandbox that lacks transformers' globals, so ``raise_exception``
    and ``strftime_now`` count as free (a request may shadow them), while jinja's own globals
    (``range``, ``dict``, ``namespace``, ...) do not.
    """
    # ChatSandbox rather than a plain sandbox: it intercepts ``**`` and friends, so analysing a
    # template never constant-folds an enormous power (which a plain sandbox would compute).
    env = ChatSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _is_key_of(node: nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, nodes.Getitem):
        return (
            _is_name(node.node, name)
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _reads(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """True when ``node`` is ``name`` (or ``name[key]``) seen through filters, tests, slices."""
    if isinstance(node, nodes.Filter):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Test):
        return _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    return _is_key_of(node, name, key) if key else _is_name(node, name)


def _target_name(node: nodes.Node) -> str:
    if not isinstance(node, nodes.Name):
        raise _Unsupported
    return node.name


def _aliases_of(ast: nodes.Template, root: str) -> list[str]:
    """``root`` and every variable ``{% set %}`` from it, transitively (breadth first)."""
    names = [root]
    queue = [root]
    seen = {root}
    while queue:
        current = queue.pop(0)
        for assign in ast.find_all(nodes.Assign):
            if _reads(assign.node, current):
                target = _target_name(assign.target)
                names.append(target)
                # vLLM guards only against self-assignment; a two-name cycle would loop there.
                if target not in seen:
                    seen.add(target)
                    queue.append(target)
    return names


def _loop_variables(ast: nodes.Template, sources: list[str], key: str | None) -> list[str]:
    found = []
    for loop in ast.find_all(nodes.For):
        if any(_reads(loop.iter, source, key) for source in sources):
            found.append(_target_name(loop.target))
    return found


def detect_content_format(ast: nodes.Template) -> ContentFormat:
    """``"openai"`` if some loop iterates over a message's ``content``, else ``"string"``."""
    try:
        message_vars = _loop_variables(ast, _aliases_of(ast, "messages"), None)
        for loop in ast.find_all(nodes.For):
            if any(_reads(loop.iter, var, "content") for var in message_vars):
                _target_name(loop.target)
                return "openai"
    except _Unsupported:
        return "string"
    return "string"


_DUNDER = re.compile(r"__\w+__|\.__\w")


def hostile_constructs(ast: nodes.Template) -> list[str]:
    """Places where the template reaches for interpreter internals (``x.__class__``,
    ``x['__globals__']``, ``x|attr('__init__')``, ``'{0.__class__}'.format(x)``): line and what.
    """
    found = []
    for node in ast.find_all(nodes.Getattr):
        if node.attr.startswith("__"):
            found.append(f"line {node.lineno}: attribute {node.attr!r}")
    for node in ast.find_all(nodes.Const):
        if isinstance(node.value, str) and _DUNDER.search(node.value):
            found.append(f"line {node.lineno}: string {node.value[:40]!r}")
    return found
