"""Per-request inputs of a key computation besides the token ids: the :class:`KeyContext`.

Every field is validated when the context is built, so a profile only has to decide whether it
supports a field, never whether the value is well formed. Validation follows the engines:
the cache salt is checked exactly as vLLM 0.33 ``validate_cache_salt`` checks it
(``vllm/entrypoints/generate/base/protocol.py``), multimodal items must be sorted by offset and
non-overlapping as vLLM assumes of ``request.mm_features`` (``vllm/v1/core/kv_cache_utils.py``,
``_gen_mm_extra_hash_keys``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenkeys.errors import InvalidArgument

# vLLM 0.33 vllm/entrypoints/generate/base/protocol.py: _CACHE_SALT_FORBIDDEN_CHARS and
# _MAX_CACHE_SALT_LENGTH. The length is counted in code points (Python len()).
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
CACHE_SALT_MAX_CHARS = 128

_MAX_TEXT = 4096  # generous bound for names, paths and identifiers; keeps requests bounded


def validate_cache_salt(salt: object) -> str:
    """Return ``salt`` if vLLM 0.33 would accept it as a request ``cache_salt``, else raise."""
    if not isinstance(salt, str) or not salt:
        raise InvalidArgument(
            f"cache_salt must be a non-empty string, got {salt!r}; omit it for no salt",
            field="cache_salt",
        )
    if len(salt) > CACHE_SALT_MAX_CHARS:
        raise InvalidArgument(
            f"cache_salt has {len(salt)} characters, at most {CACHE_SALT_MAX_CHARS} are allowed",
            field="cache_salt",
        )
    bad = sorted(CACHE_SALT_FORBIDDEN.intersection(salt))
    if bad:
        raise InvalidArgument(
            f"cache_salt contains {', '.join(repr(c) for c in bad)}; the characters "
            "'@', '/', '\\' and NUL are not allowed (vLLM validate_cache_salt)",
            field="cache_salt",
        )
    return salt


def _text(value: object, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, got {type(value).__name__}", field=name)
    if not value and not allow_empty:
        raise InvalidArgument(f"{name} must not be empty", field=name)
    if len(value) > _MAX_TEXT:
        raise InvalidArgument(
            f"{name} has {len(value)} characters, at most {_MAX_TEXT} are allowed", field=name
        )
    return value


def _int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}", field=name)
    return value


def _nonneg_int(value: object, name: str) -> int:
    _int(value, name)
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}", field=name)
    return value


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter as the engine registered it: its name and the path it was loaded from.

    vLLM 0.31+ hashes both (``("lora", lora_name, lora_path)``); earlier releases only the name.
    The path is the exact string given at registration, never normalized.
    """

    name: str
    path: str | None = None

    def __post_init__(self) -> None:
        _text(self.name, "adapter.name")
        if self.path is not None:
            _text(self.path, "adapter.path")


@dataclass(frozen=True)
class MMItem:
    """One multimodal item: its identifier (processor hash or user uuid) and placeholder span.

    ``offset`` is relative to the first given token. It is negative only for an item that began
    before a continuation's first token (the context must then carry a ``parent``): vLLM keys
    ``offset - block_start`` in every block the item overlaps, so the item must keep its true
    start for the keys after the parent to equal those of the whole prompt.
    """

    identifier: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        _text(self.identifier, "mm.identifier")
        _int(self.offset, "mm.offset")
        _nonneg_int(self.length, "mm.length")
        if self.length == 0:
            raise InvalidArgument(
                f"mm item {self.identifier!r} has length 0; a placeholder span covers >= 1 token",
                field="mm.length",
            )

    @property
    def end(self) -> int:
        """First token index after the item."""
        return self.offset + self.length


@dataclass(frozen=True)
class KeyContext:
    """Everything besides token ids that can change a request's block keys.

    ``parent`` continues a chain: the full digest of the block before the first given token
    (a :class:`~tokenkeys.keys.spec.BlockKey` or its ``digest`` bytes). With a parent, the first
    token is not token 0 of the request, so first-block-only rules (cache salt) do not apply and
    multimodal offsets are relative to the first given token.
    """

    model: str | None = None
    tokenizer_fingerprint: str | None = None
    adapter: Adapter | None = None
    cache_salt: str | None = None
    mm_items: tuple[MMItem, ...] = ()
    prompt_embeds_digests: tuple[bytes, ...] = ()
    group: int | None = None
    parent: bytes | None = field(default=None)

    def __post_init__(self) -> None:
        if self.model is not None:
            _text(self.model, "model")
        if self.tokenizer_fingerprint is not None:
            _text(self.tokenizer_fingerprint, "tokenizer_fingerprint")
        if self.adapter is not None and not isinstance(self.adapter, Adapter):
            raise InvalidArgument("adapter must be an Adapter(name, path)", field="adapter")
        if self.cache_salt is not None:
            validate_cache_salt(self.cache_salt)
        items = tuple(self.mm_items)
        object.__setattr__(self, "mm_items", items)
        for item in items:
            if not isinstance(item, MMItem):
                raise InvalidArgument("mm_items must be MMItem values", field="mm_items")
        if self.parent is None:
            negative = next((m for m in items if m.offset < 0), None)
            if negative is not None:
                raise InvalidArgument(
                    f"mm item {negative.identifier!r} has offset {negative.offset}; an offset "
                    "is negative only for an item that began before a continuation's first "
                    "token, so give the parent too (or an offset >= 0)",
                    field="mm.offset",
                )
        for before, after in zip(items, items[1:], strict=False):
            if after.offset < before.end:
                raise InvalidArgument(
                    f"mm items must be sorted by offset and must not overlap: "
                    f"{before.identifier!r} covers [{before.offset}, {before.end}) and "
                    f"{after.identifier!r} starts at {after.offset}",
                    field="mm_items",
                )
        digests = tuple(self.prompt_embeds_digests)
        object.__setattr__(self, "prompt_embeds_digests", digests)
        for i, d in enumerate(digests):
            if not isinstance(d, bytes) or len(d) != 32:
                raise InvalidArgument(
                    f"prompt_embeds_digests[{i}] must be 32 bytes (SHA-256 of the block's "
                    f"embedding tensor bytes), got {len(d) if isinstance(d, bytes) else d!r}",
                    field="prompt_embeds_digests",
                )
        if self.group is not None:
            _nonneg_int(self.group, "group")
        parent = self.parent
        if parent is not None:
            digest = getattr(parent, "digest", parent)
            if not isinstance(digest, bytes) or not digest:
                raise InvalidArgument(
                    "parent must be a BlockKey or its non-empty digest bytes", field="parent"
                )
            object.__setattr__(self, "parent", digest)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (bytes as lowercase hex); omits unset fields."""
        out: dict[str, Any] = {}
        if self.model is not None:
            out["model"] = self.model
        if self.tokenizer_fingerprint is not None:
            out["tokenizer_fingerprint"] = self.tokenizer_fingerprint
        if self.adapter is not None:
            out["adapter"] = {"name": self.adapter.name}
            if self.adapter.path is not None:
                out["adapter"]["path"] = self.adapter.path
        if self.cache_salt is not None:
            out["cache_salt"] = self.cache_salt
        if self.mm_items:
            out["mm_items"] = [
                {"identifier": m.identifier, "offset": m.offset, "length": m.length}
                for m in self.mm_items
            ]
        if self.prompt_embeds_digests:
            out["prompt_embeds_digests"] = [d.hex() for d in self.prompt_embeds_digests]
        if self.group is not None:
            out["group"] = self.group
        if self.parent is not None:
            out["parent"] = self.parent.hex()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyContext:
        """Inverse of :meth:`to_dict`; unknown fields are refused."""
        known = {
            "model",
            "tokenizer_fingerprint",
            "adapter",
            "cache_salt",
            "mm_items",
            "prompt_embeds_digests",
            "group",
            "parent",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgument(
                f"unknown key context field(s) {unknown}; allowed: {sorted(known)}",
                field="context",
            )
        adapter = data.get("adapter")
        return cls(
            model=data.get("model"),
            tokenizer_fingerprint=data.get("tokenizer_fingerprint"),
            adapter=Adapter(adapter["name"], adapter.get("path")) if adapter else None,
            cache_salt=data.get("cache_salt"),
            mm_items=tuple(
                MMItem(m["identifier"], m["offset"], m["length"]) for m in data.get("mm_items", ())
            ),
            prompt_embeds_digests=tuple(
                _hex(h, "prompt_embeds_digests") for h in data.get("prompt_embeds_digests", ())
            ),
            group=data.get("group"),
            parent=_hex(data["parent"], "parent") if data.get("parent") else None,
        )


def _hex(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a hex string", field=name)
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise InvalidArgument(f"{name} is not valid hex: {value[:40]!r}", field=name) from None


def items_overlapping(items: Sequence[MMItem], start: int, end: int) -> list[MMItem]:
    """Items whose span overlaps ``[start, end)``, in offset order.

    This is vLLM's rule (``_gen_mm_extra_hash_keys``, 0.19+): an item is keyed in every block it
    overlaps, ``offset < end and offset + length > start``; llm-d and Dynamo use the same overlap.
    """
    return [m for m in items if m.offset < end and m.end > start]
