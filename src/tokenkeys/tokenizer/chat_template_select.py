"""Choose which of a tokenizer's named chat templates renders a request.

Matched against transformers 5.24 ``PreTrainedTokenizerBase.get_chat_template``, which vLLM
calls with the resolved ``chat_template`` (the request's, or the server's ``--chat-template``)
and the request's tools:

- ``name`` that is a key of the named templates selects that template;
- any other ``name`` is itself the template text;
- no ``name``: ``"tool_use"`` when tools are given (even an empty list) and such a template
  exists, else ``"default"``; several templates without a ``"default"`` is an error.

A tokenizer with one template is ``{"default": text}`` here. (transformers keeps a lone
template as a bare string, so there a request naming ``"default"`` would render the literal
text ``default``; nobody sends that, and the difference is documented rather than copied.)
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenkeys.errors import InvalidArgument


def select_template(templates: Mapping[str, str], tools_given: bool, name: str | None) -> str:
    """Return the template text for a request, as transformers' ``get_chat_template`` would."""
    if name is not None:
        return templates.get(name, name)
    if tools_given and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if not templates:
        raise InvalidArgument(
            "this model's tokenizer has no chat template; start the server with "
            "--chat-template FILE (or send chat_template with --trust-request-chat-template)",
            field="chat_template",
        )
    raise InvalidArgument(
        "this model has several chat templates and none is named 'default'; pass the name of "
        f"one as chat_template (known: {', '.join(sorted(templates))})",
        field="chat_template",
    )
