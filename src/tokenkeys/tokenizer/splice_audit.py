"""Whether a tokenizer's texts may be cut at all, decided from the pipeline the library runs.

Cutting (:mod:`tokenkeys.tokenizer.splice`) is exact only when every step after the added-token
scan acts on each piece alone. That was read, component by component, in huggingface/tokenizers
0.23 (``normalizers/``, ``pre_tokenizers/``, ``models/``, ``processors/``): each listed below
goes through ``PreTokenizedString::split`` or ``NormalizedString`` of one piece, except
``Metaspace`` with ``prepend_scheme: "first"``, which prepends only to the piece that starts at
offset 0 of the whole text (``metaspace.rs``: ``offsets_original().0 == 0``). A component not in
these lists, BPE dropout (sampled), and truncation or padding stored in tokenizer.json make the
answer "no", with the reason; so does a post-processor whose added tokens are not one fixed
prefix and suffix around the sequence, checked against the library on probe texts at load.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenkeys.tokenizer.splice import AddedTokenMatch, SplicePlan

#: Encode texts with or without special tokens, as the backend does: the probe of the load check.
EncodeFn = Callable[[Sequence[str], bool], list[list[int]]]

_NORMALIZERS = {
    "BertNormalizer", "Strip", "StripAccents", "NFC", "NFD", "NFKC", "NFKD", "Nmt",
    "Precompiled", "Replace", "Prepend", "Lowercase", "ByteLevel",
}  # fmt: skip
_PRE_TOKENIZERS = {
    "BertPreTokenizer", "ByteLevel", "CharDelimiterSplit", "Digits", "Metaspace", "Punctuation",
    "Split", "UnicodeScripts", "Whitespace", "WhitespaceSplit", "FixedLength",
}  # fmt: skip
_MODELS = {"BPE", "WordPiece", "WordLevel", "Unigram"}


@dataclass(frozen=True)
class SpliceDecision:
    """A tokenizer's cut plan, or why its texts are always encoded whole (``reason``)."""

    plan: SplicePlan | None
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.plan is not None


def _unsafe_component(kind: str, node: Any, allowed: set[str], key: str) -> str | None:
    if node is None:
        return None
    kind_name = node.get("type")
    if kind_name == "Sequence":
        for child in node.get(key) or []:
            found = _unsafe_component(kind, child, allowed, key)
            if found:
                return found
        return None
    if kind_name not in allowed:
        return f"{kind} {kind_name!r} is not among those proven to act on each piece alone"
    if kind_name == "Metaspace" and node.get("prepend_scheme") == "first":
        return (
            "pre-tokenizer Metaspace with prepend_scheme 'first' prepends only at the start of "
            "the whole text, so a piece encodes differently alone"
        )
    return None


def _special_ids(node: Mapping[str, Any], item: Any) -> list[int]:
    if "SpecialToken" in item:
        name = item["SpecialToken"]["id"]
        return list(node["special_tokens"][name]["ids"])
    raise ValueError(item)


def _around(node: Any) -> tuple[list[int], list[int]] | str:
    """The ids the post-processor puts before and after a single sequence, or a reason."""
    if node is None or node.get("type") == "ByteLevel":
        return [], []
    kind = node.get("type")
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [int(node["cls"][1])], [int(node["sep"][1])]
    if kind == "TemplateProcessing":
        before: list[int] = []
        after: list[int] = []
        seen_sequence = False
        for item in node.get("single") or []:
            if "Sequence" in item:
                seen_sequence = True
                continue
            (after if seen_sequence else before).extend(_special_ids(node, item))
        return before, after
    if kind == "Sequence":
        before, after = [], []
        for child in node.get("processors") or []:
            found = _around(child)
            if isinstance(found, str):
                return found
            before, after = found[0] + before, after + found[1]
        return before, after
    return f"post-processor {kind!r} is not one fixed prefix and suffix around the sequence"


def _reason_in(doc: Mapping[str, Any]) -> str | None:
    for field in ("truncation", "padding"):
        if doc.get(field) is not None:
            return f"tokenizer.json sets {field}, which applies to the whole text"
    model = doc.get("model") or {}
    if model.get("type") not in _MODELS:
        return f"model {model.get('type')!r} is not among those proven to act on each piece alone"
    if model.get("type") == "BPE" and model.get("dropout") is not None:
        return "BPE dropout samples its merges, so no two encodes need agree"
    return _unsafe_component(
        "normalizer", doc.get("normalizer"), _NORMALIZERS, "normalizers"
    ) or _unsafe_component(
        "pre-tokenizer", doc.get("pre_tokenizer"), _PRE_TOKENIZERS, "pretokenizers"
    )


def _probe_texts(plan: SplicePlan) -> list[str]:
    texts = ["", "a", "Hello, world!", " 12 345\r\n\tx"]
    for token in sorted(plan.boundaries)[:32]:
        texts += [f"{token}", f"x{token}", f"a {token} b{token}\n c", f"{token}  {token}x"]
    return texts


def _probe_reason(plan: SplicePlan, encode: EncodeFn) -> str | None:
    """Differences between the plan and the library on probe texts, or None."""
    texts = _probe_texts(plan)
    plain = encode(texts, False)
    special = encode(texts, True)
    before, after = list(plan.prefix), list(plan.suffix)
    for text, ids, with_special in zip(texts, plain, special, strict=True):
        if with_special != before + ids + after:
            return (
                f"the post-processor's special tokens around {text!r} are not the fixed "
                f"prefix {before} and suffix {after} read from tokenizer.json"
            )
        pieces = plan.pieces(text)
        joined = [i for piece in encode(pieces, False) for i in piece]
        if joined != ids:
            return f"cutting {text!r} into {pieces!r} changes its ids"
    return None


def splice_decision(
    pipeline_json: str | None, *, split_special_tokens: bool, encode: EncodeFn
) -> SpliceDecision:
    """Decide whether (and where) texts of this tokenizer may be cut; never raises."""
    if pipeline_json is None:
        return SpliceDecision(
            None,
            "backend 'transformers' runs transformers' own Python steps around the library, "
            "which tokenkeys does not prove piece by piece",
        )
    doc = json.loads(pipeline_json)
    reason = _reason_in(doc)
    if reason is not None:
        return SpliceDecision(None, reason)
    around = _around(doc.get("post_processor"))
    if isinstance(around, str):
        return SpliceDecision(None, around)
    added = [AddedTokenMatch.from_json(entry) for entry in doc.get("added_tokens") or []]
    plan = SplicePlan.build(
        added, split_special_tokens=split_special_tokens, prefix=around[0], suffix=around[1]
    )
    if not plan.boundaries:
        return SpliceDecision(
            None,
            "no added token is matched on the raw text (normalized: false), not single_word "
            + ("and not special (split_special_tokens)" if split_special_tokens else "")
            + ", so no cut point is independent",
        )
    reason = _probe_reason(plan, encode)
    if reason is not None:
        return SpliceDecision(None, reason)
    return SpliceDecision(plan)
