"""Special tokens of a tokenizer folder, resolved to ids from every file that declares them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenkeys.errors import TokenizerLoadError
from tokenkeys.tokenizer.backends import TokenizerBackend
from tokenkeys.tokenizer.folder import TEMPLATE_DIR, TokenizerFolder

# transformers' VERY_LARGE_INTEGER: a tokenizer_config.json without a real limit stores this.
_NO_LIMIT = int(1e20)


@dataclass(frozen=True, slots=True)
class TokenRef:
    """A token named by a role (bos, eos, pad, unk) with its id."""

    content: str
    id: int


@dataclass(frozen=True, slots=True)
class AddedToken:
    """A token added on top of the model vocabulary, and whether it is special."""

    id: int
    content: str
    special: bool


@dataclass(frozen=True)
class Specials:
    """The special tokens of a tokenizer: roles with ids, every EOS, and all added tokens."""

    bos: TokenRef | None
    eos: tuple[TokenRef, ...]
    pad: TokenRef | None
    unk: TokenRef | None
    added: tuple[AddedToken, ...]
    model_max_length: int | None


def _content(value: Any) -> str | None:
    """A token declaration is a string, an AddedToken-like dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ref(backend: TokenizerBackend, content: str | None, source: str) -> TokenRef | None:
    if not content:
        return None
    token_id = backend.token_to_id(content)
    if token_id is None:
        raise TokenizerLoadError(
            f"{source}: declares special token {content!r}, which is not in the vocabulary",
            field=source,
        )
    return TokenRef(content, token_id)


def read_specials(folder: TokenizerFolder, backend: TokenizerBackend) -> Specials:
    """Resolve bos/eos/pad/unk and the added tokens; generation_config's eos ids are added."""
    config = folder.json("tokenizer_config.json")
    smap = folder.json("special_tokens_map.json")
    gen = folder.json("generation_config.json")
    tok_json = folder.json("tokenizer.json")

    def declared(role: str) -> tuple[str | None, str]:
        # tokenizer_config.json wins over special_tokens_map.json, as in transformers.
        key = f"{role}_token"
        if key in config:
            return _content(config[key]), "tokenizer_config.json"
        return _content(smap.get(key)), "special_tokens_map.json"

    refs = {role: _ref(backend, *declared(role)) for role in ("bos", "eos", "pad", "unk")}
    eos: list[TokenRef] = [refs["eos"]] if refs["eos"] else []
    gen_eos = gen.get("eos_token_id")
    for token_id in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
        if isinstance(token_id, int) and all(e.id != token_id for e in eos):
            content = backend.id_to_token(token_id)
            if content is None:
                raise TokenizerLoadError(
                    f"generation_config.json: eos_token_id {token_id} is outside the vocabulary",
                    field="generation_config.json",
                )
            eos.append(TokenRef(content, token_id))

    added = tuple(
        AddedToken(int(t["id"]), str(t["content"]), bool(t.get("special", False)))
        for t in tok_json.get("added_tokens", [])
    )
    limit = config.get("model_max_length")
    max_len = int(limit) if isinstance(limit, (int, float)) and 0 < limit < _NO_LIMIT else None
    return Specials(refs["bos"], tuple(eos), refs["pad"], refs["unk"], added, max_len)


# The named tokens transformers passes to chat templates (its ``special_tokens_map``).
TEMPLATE_TOKEN_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def template_special_tokens(folder: TokenizerFolder) -> dict[str, str]:
    """``{"bos_token": "<s>", ...}`` as transformers hands them to a chat template.

    Only tokens the tokenizer files declare by role; generation_config's extra EOS ids are
    not template variables.
    """
    config = folder.json("tokenizer_config.json")
    smap = folder.json("special_tokens_map.json")
    out = {}
    for role in TEMPLATE_TOKEN_ROLES:
        key = f"{role}_token"
        content = _content(config[key]) if key in config else _content(smap.get(key))
        if content:
            out[key] = content
    return out


def read_chat_templates(folder: TokenizerFolder) -> dict[str, str]:
    """Collect named chat templates the way transformers 5 and vLLM find them.

    - tokenizer_config.json ``chat_template``: a string (the default) or a list of
      ``{name, template}`` (transformers ``PreTrainedTokenizerBase.__init__``);
    - chat_template.jinja and additional_chat_templates/NAME.jinja, when present, *replace*
      those entirely (transformers ``from_pretrained`` passes them as the ``chat_template``
      init argument);
    - chat_template.json belongs to a multimodal processor; vLLM falls back to it only when the
      tokenizer has no template (``resolve_hf_chat_template``), and so do we.
    """
    templates: dict[str, str] = {}
    value = folder.json("tokenizer_config.json").get("chat_template")
    if isinstance(value, str):
        templates["default"] = value
    elif isinstance(value, list):
        for item in value:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise TokenizerLoadError(
                    "tokenizer_config.json: every chat_template list item needs a string "
                    "'name' and 'template'",
                    field="tokenizer_config.json",
                )
            templates[item["name"]] = item["template"]
    elif value is not None:
        raise TokenizerLoadError(
            "tokenizer_config.json: chat_template must be a string or a list, "
            f"got {type(value).__name__}",
            field="tokenizer_config.json",
        )
    from_files = {
        ("default" if path == "chat_template.jinja" else path.split("/", 1)[1][: -len(".jinja")]): (
            folder.text(path) or ""
        )
        for path in folder.contents
        if path == "chat_template.jinja" or path.startswith(f"{TEMPLATE_DIR}/")
    }
    if from_files:
        return from_files
    if not templates:
        processor = folder.json("chat_template.json").get("chat_template")
        if isinstance(processor, str):
            templates["default"] = processor
    return templates
