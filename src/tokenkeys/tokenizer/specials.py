"""Special tokens of a tokenizer folder, resolved to ids from every file that declares them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenkeys.errors import TokenizerLoadError
from tokenkeys.tokenizer.backends import TokenizerBackend
from tokenkeys.tokenizer.folder import TokenizerFolder

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

    def special_ids(self) -> frozenset[int]:
        """Ids that ``skip_special_tokens`` removes."""
        ids = {a.id for a in self.added if a.special}
        for ref in (self.bos, self.pad, self.unk, *self.eos):
            if ref is not None:
                ids.add(ref.id)
        return frozenset(ids)


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


def read_chat_templates(folder: TokenizerFolder) -> dict[str, str]:
    """Collect named chat templates; later sources override earlier ones, as in transformers.

    Order: tokenizer_config.json ``chat_template`` (a string, or a list of {name, template}),
    then chat_template.json, then chat_template.jinja (the default template).
    """
    templates: dict[str, str] = {}

    def add(value: Any, source: str) -> None:
        if isinstance(value, str):
            templates["default"] = value
        elif isinstance(value, list):
            for item in value:
                if not (isinstance(item, dict) and isinstance(item.get("template"), str)):
                    raise TokenizerLoadError(
                        f"{source}: chat_template list items need 'name' and 'template'",
                        field=source,
                    )
                templates[str(item.get("name", "default"))] = item["template"]
        elif value is not None:
            raise TokenizerLoadError(
                f"{source}: chat_template must be a string or a list, got {type(value).__name__}",
                field=source,
            )

    add(folder.json("tokenizer_config.json").get("chat_template"), "tokenizer_config.json")
    add(folder.json("chat_template.json").get("chat_template"), "chat_template.json")
    jinja = folder.text("chat_template.jinja")
    if jinja is not None:
        templates["default"] = jinja
    return templates
