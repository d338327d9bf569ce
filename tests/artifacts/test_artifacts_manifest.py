"""Manifest checks: every rule is enforced on the manifest alone, before any byte is written."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
from faulty_streams import consistent_manifest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactLimits, ArtifactStreamer, Manifest
from tokenkeys.artifacts.manifest import options_from_identity
from tokenkeys.artifacts.streamer import StreamPlan
from tokenkeys.errors import ArtifactError, LimitExceeded
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path
from tokenkeys.tokenizer.proto import tokenizer_identity


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(default_tokenizer_path())


@pytest.fixture
def manifest(tokenizer: Tokenizer) -> pb.ArtifactManifest:
    streamer = ArtifactStreamer(tokenizer, tokenizer_identity(tokenizer))
    return streamer.manifest(StreamPlan(streamer.paths, 0, 65536))


def test_real_manifest_passes_and_recomputes_the_fingerprint(
    manifest: pb.ArtifactManifest, tokenizer: Tokenizer
) -> None:
    m = Manifest.from_proto(manifest, ArtifactLimits(), tokenizer.fingerprint)
    assert m.fingerprint == tokenizer.fingerprint
    assert m.files == tokenizer.folder.entries
    assert m.options == tokenizer.options and m.behaviour == tokenizer.backend.behaviour
    assert m.tokenizer_size == m.stream_size == sum(e.size for e in tokenizer.folder.entries)


def _rename(path: str) -> Callable[[pb.ArtifactManifest], None]:
    def edit(m: pb.ArtifactManifest) -> None:
        m.files[1].path = path  # tokenizer_config.json
        m.streamed_paths[1] = path
        consistent_manifest(m)

    return edit


@pytest.mark.parametrize("bad", ["../x", "/etc/x", "a/../../b", "a\\b", "tok\x00.json", "C:x"])
def test_unsafe_paths_are_refused_first(manifest: pb.ArtifactManifest, bad: str) -> None:
    _rename(bad)(manifest)
    with pytest.raises(ArtifactError) as info:
        Manifest.from_proto(manifest, ArtifactLimits())
    assert info.value.details["fault"] == "unsafe-path"
    assert repr(bad) in info.value.message


def _set(field: str, value: object) -> Callable[[pb.ArtifactManifest], None]:
    return lambda m: setattr(m, field, value)


def _file(index: int, field: str, value: object) -> Callable[[pb.ArtifactManifest], None]:
    return lambda m: setattr(m.files[index], field, value)


CASES: dict[str, tuple[Callable[[pb.ArtifactManifest], None], str, str]] = {
    "unknown file": (_rename("weights.bin"), "unknown-file", "weights.bin"),
    "bad format": (_set("format", "gguf"), "bad-manifest", "format"),
    "uppercase digest": (
        _file(0, "sha256", "A" * 64),
        "bad-manifest",
        "tokenizer.json",
    ),
    "short fingerprint": (_set("fingerprint", "ab"), "bad-manifest", "fingerprint"),
    "total size": (_set("total_size", 1), "bad-manifest", "total_size"),
    "chunk size zero": (_set("chunk_size", 0), "bad-manifest", "chunk_size"),
    "start offset past file": (_set("start_offset", 10**9), "bad-manifest", "start_offset"),
    "fingerprint of other files": (
        _file(0, "sha256", "0" * 64),
        "fingerprint-mismatch",
        "advertises",
    ),
    "identity edited": (
        lambda m: setattr(m.identity, "behaviour", "tokenizers/2"),
        "fingerprint-mismatch",
        "advertises",
    ),
    "nul enum": (
        lambda m: setattr(m.identity.defaults, "nul_handling", 0),
        "bad-manifest",
        "nul_handling",
    ),
    "unknown backend": (
        lambda m: setattr(m.identity, "backend", "sentencepiece"),
        "bad-manifest",
        "sentencepiece",
    ),
    "missing tokenizer.json": (
        lambda m: (m.files.pop(0), m.streamed_paths.pop(0), consistent_manifest(m)),
        "bad-manifest",
        "tokenizer.json",
    ),
    "streamed unknown": (
        lambda m: m.streamed_paths.append("special_tokens_map.json"),
        "bad-manifest",
        "streamed_paths",
    ),
    "unsorted files": (
        lambda m: (m.files.reverse(), consistent_manifest(m)),
        "bad-manifest",
        "sorted",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_rule_names_the_fault(manifest: pb.ArtifactManifest, case: str) -> None:
    edit, fault, words = CASES[case]
    edit(manifest)
    with pytest.raises(ArtifactError) as info:
        Manifest.from_proto(manifest, ArtifactLimits())
    assert info.value.details["fault"] == fault
    assert words in info.value.message


def test_expected_fingerprint_must_match(manifest: pb.ArtifactManifest) -> None:
    with pytest.raises(ArtifactError, match="was asked for") as info:
        Manifest.from_proto(manifest, ArtifactLimits(), "0" * 64)
    assert info.value.details["fault"] == "fingerprint-mismatch"


def test_size_caps_are_limits_naming_the_file(manifest: pb.ArtifactManifest) -> None:
    with pytest.raises(LimitExceeded, match="tokenizer.json: 1759751 bytes") as info:
        Manifest.from_proto(manifest, ArtifactLimits(max_file_bytes=1_000_000))
    assert info.value.field == "tokenizer.json"
    with pytest.raises(LimitExceeded, match="total cap") as info:
        Manifest.from_proto(manifest, ArtifactLimits(max_total_bytes=1_760_000))
    assert info.value.field == "manifest"


@given(
    st.builds(
        TokenizerOptions,
        backend=st.sampled_from(["tokenizers", "transformers"]),
        add_special_tokens_completion=st.booleans(),
        add_special_tokens_chat=st.booleans(),
        nul=st.sampled_from(["keep", "strip"]),
        split_special_tokens=st.booleans(),
        chat_template_sha256=st.none() | st.text("0123456789abcdef", min_size=64, max_size=64),
    ),
    st.sampled_from(["tokenizers/1", "transformers/1;major=5"]),
)
def test_identity_round_trips_through_the_servers_message(
    options: TokenizerOptions, behaviour: str
) -> None:
    # The client's inverse must follow the server's tokenizer_identity field for field.
    fake = SimpleNamespace(options=options, backend=SimpleNamespace(behaviour=behaviour))
    assert options_from_identity(tokenizer_identity(fake)) == (options, behaviour)  # type: ignore[arg-type]
