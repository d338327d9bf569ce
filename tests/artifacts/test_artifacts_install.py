"""The transport-free Receiver: fed by hand, it installs only complete, verified streams."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from faulty_streams import leftovers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactCache, ArtifactStreamer, Receiver
from tokenkeys.artifacts.cache import METADATA_FILE
from tokenkeys.artifacts.streamer import StreamPlan
from tokenkeys.errors import ArtifactError
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path, read_folder
from tokenkeys.tokenizer.proto import tokenizer_identity

TOKENIZER = Tokenizer.load(default_tokenizer_path())
STREAMER = ArtifactStreamer(TOKENIZER, tokenizer_identity(TOKENIZER))
CONTENTS = TOKENIZER.folder.contents


def stream(chunk_size: int = 65536) -> list[pb.TokenizerArtifactChunk]:
    async def collect() -> list[pb.TokenizerArtifactChunk]:
        request = pb.GetTokenizerArtifactsRequest(chunk_size=chunk_size)
        return [m async for m in STREAMER.stream(request)]

    return asyncio.run(collect())


def split_stream(cuts: dict[str, list[int]], chunk_size: int) -> list[pb.TokenizerArtifactChunk]:
    """A valid stream whose data chunks end at the given cut points of each file."""
    manifest = STREAMER.manifest(StreamPlan(STREAMER.paths, 0, chunk_size))
    out = [pb.TokenizerArtifactChunk(manifest=manifest)]
    for entry in TOKENIZER.folder.entries:
        data = CONTENTS[entry.path]
        bounds = sorted({0, len(data), *(c for c in cuts.get(entry.path, []) if c < len(data))})
        for a, b in zip(bounds, bounds[1:], strict=False):
            out.append(
                pb.TokenizerArtifactChunk(
                    data=pb.ArtifactData(path=entry.path, offset=a, data=data[a:b])
                )
            )
        out.append(
            pb.TokenizerArtifactChunk(
                file_end=pb.ArtifactFileEnd(path=entry.path, size=entry.size, sha256=entry.sha256)
            )
        )
    return out


def receive(cache: ArtifactCache, messages: list[pb.TokenizerArtifactChunk]):  # noqa: ANN201
    with Receiver(cache, expected_fingerprint=TOKENIZER.fingerprint, origin=("tok", "t")) as r:
        for m in messages:
            r.feed(m)
        return r.install()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_split_of_the_stream_installs_the_same_bytes(
    tmp_path: Path, data: st.DataObject
) -> None:
    chunk_size = data.draw(st.integers(1024, 2_000_000), label="chunk_size")
    cuts = {}
    for entry in TOKENIZER.folder.entries:
        # Random cut points, then regular ones so that no chunk exceeds chunk_size.
        points = data.draw(st.lists(st.integers(1, entry.size), max_size=20), label=entry.path)
        bounds = sorted({0, entry.size, *points})
        for a, b in zip(bounds, bounds[1:], strict=False):
            points.extend(range(a + chunk_size, b, chunk_size))
        cuts[entry.path] = points
    cache = ArtifactCache(tmp_path / data.draw(st.uuids()).hex)
    installed = receive(cache, split_stream(cuts, chunk_size))
    assert installed.fingerprint == TOKENIZER.fingerprint
    assert installed.transferred == sum(e.size for e in TOKENIZER.folder.entries)
    folder = read_folder(installed.path)
    assert folder.contents == CONTENTS
    assert leftovers(cache.root) == sorted(
        [installed.fingerprint]
        + [f"{installed.fingerprint}/{n}" for n in [*CONTENTS, METADATA_FILE]]
    )


def test_a_bad_manifest_creates_nothing(tmp_path: Path) -> None:
    messages = stream()
    messages[0].manifest.files[0].sha256 = "0" * 64
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(ArtifactError, match="fingerprint"):
        receive(cache, messages)
    assert not cache.root.exists(), "not even the cache folder was created"


def _fail(messages: list[pb.TokenizerArtifactChunk], tmp_path: Path) -> ArtifactError:
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(ArtifactError) as info:
        receive(cache, messages)
    assert leftovers(cache.root) == []
    return info.value


def test_stream_must_open_with_the_manifest(tmp_path: Path) -> None:
    error = _fail(stream()[1:], tmp_path)
    assert error.details["fault"] == "no-manifest"


def test_nothing_may_follow_the_last_file(tmp_path: Path) -> None:
    messages = stream()
    messages.append(messages[-1])
    assert _fail(messages, tmp_path).details["fault"] == "trailing-data"


def test_files_arrive_in_manifest_order(tmp_path: Path) -> None:
    messages = stream()
    first_config = next(i for i, m in enumerate(messages) if m.data.path == "tokenizer_config.json")
    messages.insert(1, messages.pop(first_config))
    error = _fail(messages, tmp_path)
    assert error.details["fault"] == "unexpected-file" and error.field == "tokenizer_config.json"


def test_empty_and_oversized_chunks_are_refused(tmp_path: Path) -> None:
    messages = stream()
    messages[1].data.data = b""
    assert _fail(messages, tmp_path).details["fault"] == "oversized-chunk"
    messages = stream()
    messages[0].manifest.chunk_size = 1000  # data chunks are 65536 bytes
    assert _fail(messages, tmp_path).details["fault"] == "oversized-chunk"


def test_a_stream_ending_early_is_truncated(tmp_path: Path) -> None:
    error = _fail(stream()[:5], tmp_path)
    assert error.details["fault"] == "truncated" and error.field == "tokenizer.json"
    assert "tokenizer.json at byte 262144 of 1759751" in error.message


def test_resumed_stream_must_continue_where_it_stopped(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    first = stream()
    with Receiver(cache, expected_fingerprint=TOKENIZER.fingerprint) as r:
        for m in first[:4]:
            r.feed(m)
        assert r.resume_point() == ("tokenizer.json", 3 * 65536)
        wrong = STREAMER.manifest(StreamPlan(STREAMER.paths, 65536, 65536))
        with pytest.raises(ArtifactError) as info:
            r.feed(pb.TokenizerArtifactChunk(manifest=wrong))
        assert info.value.details["fault"] == "resume-mismatch"
        right = STREAMER.manifest(StreamPlan(STREAMER.paths, 3 * 65536, 65536))
        r.feed(pb.TokenizerArtifactChunk(manifest=right))
        for m in first[4:]:
            r.feed(m)
        installed = r.install()
    assert read_folder(installed.path).contents == CONTENTS


def test_a_second_install_of_the_same_fingerprint_keeps_the_first(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    a = receive(cache, stream())
    b = receive(cache, stream())
    assert a.path == b.path
    assert leftovers(cache.root) == sorted(
        [a.fingerprint] + [f"{a.fingerprint}/{n}" for n in [*CONTENTS, METADATA_FILE]]
    )


def test_an_interrupt_while_receiving_removes_the_partial_folder(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt), Receiver(cache) as r:
        for i, m in enumerate(stream()):
            r.feed(m)
            if i == 3:
                assert len(leftovers(cache.root)) == 2  # the partial folder and its first file
                raise KeyboardInterrupt
    assert leftovers(cache.root) == []
