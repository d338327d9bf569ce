"""GetTokenizerArtifacts on a real server: stream layout, subsets, resume, refusals."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys._gen.openengine.v1 import tokenizer_pb2_grpc
from tokenkeys.artifacts import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, ArtifactStreamer
from tokenkeys.errors import ConfigError, InvalidArgument, NotFound
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path
from tokenkeys.tokenizer.proto import tokenizer_identity

from support import ServerThread

_TOKENIZER = Tokenizer.load(default_tokenizer_path())
_STREAMER = ArtifactStreamer(_TOKENIZER, tokenizer_identity(_TOKENIZER))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return _TOKENIZER


@pytest.fixture(scope="module")
def stub() -> tokenizer_pb2_grpc.OpenEngineTokenizerStub:
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits())
    with ServerThread(models) as server, grpc.insecure_channel(server.target) as channel:
        yield tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)


def collect(stub, **fields) -> list[pb.TokenizerArtifactChunk]:  # noqa: ANN001
    return list(stub.GetTokenizerArtifacts(pb.GetTokenizerArtifactsRequest(**fields)))


def check_layout(chunks: list[pb.TokenizerArtifactChunk], contents: dict[str, bytes]) -> bytes:
    """Assert the stream's order rules; return the bytes of each streamed file, concatenated."""
    assert chunks[0].WhichOneof("kind") == "manifest"
    manifest = chunks[0].manifest
    expected_next = {
        p: (manifest.start_offset if i == 0 else 0) for i, p in enumerate(manifest.streamed_paths)
    }
    order = []
    received: dict[str, bytes] = {}
    for c in chunks[1:]:
        kind = c.WhichOneof("kind")
        assert kind in ("data", "file_end")
        if kind == "data":
            d = c.data
            assert d.offset == expected_next[d.path], "offsets are contiguous"
            assert 0 < len(d.data) <= manifest.chunk_size
            expected_next[d.path] += len(d.data)
            received[d.path] = received.get(d.path, b"") + d.data
            if not order or order[-1] != d.path:
                order.append(d.path)
        else:
            end = c.file_end
            assert expected_next[end.path] == end.size == len(contents[end.path])
            assert end.sha256 == hashlib.sha256(contents[end.path]).hexdigest()
            if not order or order[-1] != end.path:
                order.append(end.path)
    assert order == list(manifest.streamed_paths)
    assert sum(len(b) for b in received.values()) == manifest.total_size
    return b"".join(received.get(p, b"") for p in manifest.streamed_paths)


def test_full_stream_layout(stub, tokenizer: Tokenizer) -> None:
    chunks = collect(stub, chunk_size=100_000)
    manifest = chunks[0].manifest
    assert manifest.fingerprint == tokenizer.fingerprint
    assert [(f.path, f.size, f.sha256) for f in manifest.files] == [
        (e.path, e.size, e.sha256) for e in tokenizer.folder.entries
    ]
    assert list(manifest.streamed_paths) == [e.path for e in tokenizer.folder.entries]
    assert manifest.identity == tokenizer_identity(tokenizer)
    assert manifest.format == "huggingface" and manifest.chunk_size == 100_000
    contents = tokenizer.folder.contents
    got = check_layout(chunks, contents)
    assert got == b"".join(contents[e.path] for e in tokenizer.folder.entries)


def test_default_chunk_size_and_supported_operation(stub) -> None:
    chunks = collect(stub)
    assert chunks[0].manifest.chunk_size == DEFAULT_CHUNK_SIZE
    info = stub.GetTokenizerInfo(pb.GetTokenizerInfoRequest())
    assert pb.TOKENIZER_OPERATION_ARTIFACTS in info.supported_operations


def test_subset_of_paths(stub, tokenizer: Tokenizer) -> None:
    chunks = collect(stub, paths=["tokenizer_config.json"])
    manifest = chunks[0].manifest
    assert len(manifest.files) == 2, "the manifest still lists every file"
    assert list(manifest.streamed_paths) == ["tokenizer_config.json"]
    assert (
        check_layout(chunks, tokenizer.folder.contents)
        == tokenizer.folder.contents["tokenizer_config.json"]
    )


@pytest.mark.parametrize("offset", [0, 1, 65_536, 1_759_750, 1_759_751])
def test_resume_from_path_and_offset(stub, tokenizer: Tokenizer, offset: int) -> None:
    chunks = collect(
        stub, chunk_size=65_536, resume=pb.ArtifactResume(path="tokenizer.json", offset=offset)
    )
    manifest = chunks[0].manifest
    assert manifest.start_offset == offset
    contents = tokenizer.folder.contents
    got = check_layout(chunks, contents)
    assert got == contents["tokenizer.json"][offset:] + contents["tokenizer_config.json"]


def test_resume_at_a_later_file_skips_earlier_ones(stub, tokenizer: Tokenizer) -> None:
    chunks = collect(stub, resume=pb.ArtifactResume(path="tokenizer_config.json", offset=10))
    assert list(chunks[0].manifest.streamed_paths) == ["tokenizer_config.json"]
    assert (
        check_layout(chunks, tokenizer.folder.contents)
        == (tokenizer.folder.contents["tokenizer_config.json"][10:])
    )


@pytest.mark.parametrize(
    "fields, code, words",
    [
        ({"chunk_size": 1023}, grpc.StatusCode.INVALID_ARGUMENT, "chunk_size 1023"),
        ({"chunk_size": MAX_CHUNK_SIZE + 1}, grpc.StatusCode.INVALID_ARGUMENT, "gRPC message"),
        ({"paths": ["../tokenizer.json"]}, grpc.StatusCode.INVALID_ARGUMENT, "'..' segment"),
        ({"paths": ["/etc/passwd"]}, grpc.StatusCode.INVALID_ARGUMENT, "absolute"),
        ({"paths": ["a\\b"]}, grpc.StatusCode.INVALID_ARGUMENT, "backslash"),
        ({"paths": ["NOTICE"]}, grpc.StatusCode.NOT_FOUND, "not a file of this tokenizer"),
        (
            {"paths": ["tokenizer.json", "tokenizer.json"]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "twice",
        ),
        (
            {"paths": ["tokenizer.json"], "resume": {"path": "tokenizer_config.json"}},
            grpc.StatusCode.INVALID_ARGUMENT,
            "resume.path",
        ),
        (
            {"resume": {"path": "tokenizer.json", "offset": 1_759_752}},
            grpc.StatusCode.INVALID_ARGUMENT,
            "past the end",
        ),
        ({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "served models"),
        (
            {"expected_fingerprint": "0" * 64},
            grpc.StatusCode.FAILED_PRECONDITION,
            "pull the new revision",
        ),
    ],
)
def test_bad_requests_are_refused_before_anything_streams(stub, fields, code, words) -> None:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as info:
        collect(stub, **fields)
    assert info.value.code() == code
    assert words in info.value.details()


def test_stale_fingerprint_carries_the_current_one(stub, tokenizer: Tokenizer) -> None:
    with pytest.raises(grpc.RpcError) as info:
        collect(stub, expected_fingerprint="0" * 64)
    metadata = dict(info.value.trailing_metadata())
    assert metadata["tokenkeys-fingerprint"] == tokenizer.fingerprint


def test_streams_the_fingerprinted_bytes_not_the_disk(grpc_server, tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), folder)
    models = load_models([ModelSource("tok", folder)], TokenizerOptions(), Limits())
    original = (folder / "tokenizer_config.json").read_bytes()
    # Changed, then replaced by a link to a file outside the folder, after loading: neither
    # can reach a client under the loaded fingerprint.
    (folder / "tokenizer_config.json").unlink()
    (tmp_path / "secret").write_text("outside")
    (folder / "tokenizer_config.json").symlink_to(tmp_path / "secret")
    server = grpc_server(models)
    with grpc.insecure_channel(server.target) as channel:
        chunks = collect(tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel))
    data = b"".join(c.data.data for c in chunks if c.data.path == "tokenizer_config.json")
    assert data == original


def test_streamer_refuses_bytes_that_are_not_the_fingerprinted_ones(tokenizer: Tokenizer) -> None:
    import dataclasses

    tampered = dict(tokenizer.folder.contents)
    tampered["tokenizer_config.json"] = b"{}" + tampered["tokenizer_config.json"][2:]
    folder = dataclasses.replace(tokenizer.folder, contents=tampered)
    bad = dataclasses.replace(tokenizer, folder=folder)
    with pytest.raises(ConfigError, match="changed since fingerprinting"):
        ArtifactStreamer(bad, tokenizer_identity(tokenizer))


_SERVABLE = ["tokenizer.json", "tokenizer_config.json"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                *_SERVABLE,
                "NOTICE",
                "../NOTICE",
                "/etc/passwd",
                "tokenizer.json/..",
                ".",
                "",
                "data/../tokenizer.json",
                "TOKENIZER.JSON",
                "tokenizer.json\x00",
            ]
        ),
        max_size=4,
    )
)
def test_only_the_fingerprinted_files_can_ever_be_planned(paths: list[str]) -> None:
    streamer = _STREAMER
    request = pb.GetTokenizerArtifactsRequest(paths=paths)
    try:
        plan = streamer.plan(request)
    except (InvalidArgument, NotFound):
        assert set(paths) - set(_SERVABLE) or len(set(paths)) != len(paths)
        return
    assert set(plan.paths) <= set(_SERVABLE)
    assert set(plan.paths) == (set(paths) or set(_SERVABLE))
