"""Faulty transfers against a real server: each is refused, names file and fault, leaves nothing.

The server is real (gRPC on loopback, the real servicer); only its artifact streamer is replaced
by :class:`FaultyStreamer`, which rewrites the real stream. Every test ends with an empty cache
(no entry, no partial folder) and an error whose ``field`` and message name the file at fault.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import grpc
import pytest
from faulty_streams import (
    Abort,
    Stall,
    consistent_manifest,
    data_indices,
    end_index,
    leftovers,
    served,
)

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactLimits, PullSettings, fetch, pull_async
from tokenkeys.errors import (
    ArtifactError,
    DeadlineExceeded,
    LimitExceeded,
    TokenkeysError,
    Unavailable,
)
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

TOKENIZER = Tokenizer.load(default_tokenizer_path())
CHUNK = 65536
SETTINGS = PullSettings(chunk_size=CHUNK, resume_backoff=0.01)


def attempt(grpc_server, tmp_path: Path, mutation, settings=SETTINGS) -> TokenkeysError:  # noqa: ANN001
    """Pull through a server whose stream ``mutation`` rewrites; return the error raised."""
    registry, _ = served(TOKENIZER, mutation)
    server = grpc_server(registry)
    cache = tmp_path / "cache"
    with pytest.raises(TokenkeysError) as info:
        fetch(server.target, cache=cache, settings=settings)
    assert leftovers(cache) == [], "nothing installed, no temporary file left"
    assert list(tmp_path.iterdir()) in ([], [cache])
    return info.value


def assert_fault(error: TokenkeysError, path: str, fault: str) -> None:
    assert isinstance(error, ArtifactError), error
    assert error.field == path and error.details["fault"] == fault
    assert error.message.startswith(f"{path}: "), error.message


def edit(messages: list[pb.TokenizerArtifactChunk], i: int) -> pb.TokenizerArtifactChunk:
    """A copy of message ``i`` put in its place, to edit without touching the real stream."""
    copy = pb.TokenizerArtifactChunk()
    copy.CopyFrom(messages[i])
    messages[i] = copy
    return copy


def test_corrupted_chunk(grpc_server, tmp_path: Path) -> None:
    def corrupt(messages, call):  # noqa: ANN001, ANN202
        chunk = edit(messages, data_indices(messages)[3])
        data = bytearray(chunk.data.data)
        data[100] ^= 0x01
        chunk.data.data = bytes(data)
        return messages

    error = attempt(grpc_server, tmp_path, corrupt)
    assert_fault(error, "tokenizer.json", "corrupt")
    assert "corrupted in transit" in error.message


def test_missing_chunk(grpc_server, tmp_path: Path) -> None:
    def drop(messages, call):  # noqa: ANN001, ANN202
        del messages[data_indices(messages)[3]]
        return messages

    error = attempt(grpc_server, tmp_path, drop)
    assert_fault(error, "tokenizer.json", "offset-gap")
    assert f"chunk at offset {4 * CHUNK}, but {3 * CHUNK} bytes were received" in error.message


def test_overlapping_offsets(grpc_server, tmp_path: Path) -> None:
    def overlap(messages, call):  # noqa: ANN001, ANN202
        i = data_indices(messages)[3]
        messages.insert(i + 1, messages[i])  # the same chunk twice
        return messages

    error = attempt(grpc_server, tmp_path, overlap)
    assert_fault(error, "tokenizer.json", "offset-overlap")


def test_overlap_by_a_few_bytes(grpc_server, tmp_path: Path) -> None:
    def shift(messages, call):  # noqa: ANN001, ANN202
        chunk = edit(messages, data_indices(messages)[4])
        chunk.data.offset -= 10
        return messages

    assert_fault(attempt(grpc_server, tmp_path, shift), "tokenizer.json", "offset-overlap")


def test_reordered_offsets(grpc_server, tmp_path: Path) -> None:
    def swap(messages, call):  # noqa: ANN001, ANN202
        a, b = data_indices(messages)[3:5]
        messages[a], messages[b] = messages[b], messages[a]
        return messages

    error = attempt(grpc_server, tmp_path, swap)
    assert_fault(error, "tokenizer.json", "offset-gap")
    assert "missing or out of order" in error.message


def test_size_mismatch_in_file_end(grpc_server, tmp_path: Path) -> None:
    def bigger(messages, call):  # noqa: ANN001, ANN202
        edit(messages, end_index(messages, "tokenizer_config.json")).file_end.size += 1
        return messages

    error = attempt(grpc_server, tmp_path, bigger)
    assert_fault(error, "tokenizer_config.json", "size-mismatch")
    assert "file end says 890 bytes, the manifest 889" in error.message


def test_data_past_the_declared_size(grpc_server, tmp_path: Path) -> None:
    def extra(messages, call):  # noqa: ANN001, ANN202
        end = end_index(messages, "tokenizer_config.json")
        size = messages[end].file_end.size
        more = pb.ArtifactData(path="tokenizer_config.json", offset=size, data=b"\n")
        messages.insert(end, pb.TokenizerArtifactChunk(data=more))
        return messages

    error = attempt(grpc_server, tmp_path, extra)
    assert_fault(error, "tokenizer_config.json", "size-mismatch")
    assert "runs past the file's size" in error.message


def test_digest_mismatch_in_file_end(grpc_server, tmp_path: Path) -> None:
    def other_digest(messages, call):  # noqa: ANN001, ANN202
        edit(messages, end_index(messages, "tokenizer.json")).file_end.sha256 = "ab" * 32
        return messages

    error = attempt(grpc_server, tmp_path, other_digest)
    assert_fault(error, "tokenizer.json", "digest-mismatch")


def test_manifest_digest_lies_about_the_bytes(grpc_server, tmp_path: Path) -> None:
    # A self-consistent manifest (and file ends) for other bytes than the ones sent.
    fake = hashlib.sha256(b"other").hexdigest()

    def lie(messages, call):  # noqa: ANN001, ANN202
        manifest = edit(messages, 0).manifest
        manifest.files[1].sha256 = fake
        consistent_manifest(manifest)
        edit(messages, end_index(messages, "tokenizer_config.json")).file_end.sha256 = fake
        return messages

    error = attempt(grpc_server, tmp_path, lie)
    # The client asked for the fingerprint GetTokenizerInfo announced: refused before any byte.
    assert_fault(error, "manifest", "fingerprint-mismatch")
    assert "was asked for" in error.message


def test_fingerprint_mismatch(grpc_server, tmp_path: Path) -> None:
    def other_identity(messages, call):  # noqa: ANN001, ANN202
        edit(messages, 0).manifest.identity.defaults.add_special_tokens = False
        return messages

    error = attempt(grpc_server, tmp_path, other_identity)
    assert_fault(error, "manifest", "fingerprint-mismatch")
    assert f"advertises {TOKENIZER.fingerprint}" in error.message


@pytest.mark.parametrize("bad", ["../x", "/etc/x", "a/../../b", "a\\b", "x\x00y"])
def test_traversal_paths_are_refused_before_any_byte(grpc_server, tmp_path: Path, bad: str) -> None:
    def rename(messages, call):  # noqa: ANN001, ANN202
        for i, m in enumerate(messages):
            kind = m.WhichOneof("kind")
            if kind == "manifest":
                manifest = edit(messages, i).manifest
                manifest.files[1].path = bad
                manifest.streamed_paths[1] = bad
                consistent_manifest(manifest)
            elif getattr(m, kind).path == "tokenizer_config.json":
                getattr(edit(messages, i), kind).path = bad
        return messages

    error = attempt(grpc_server, tmp_path, rename)
    assert_fault(error, repr(bad), "unsafe-path")
    for name in ("x", "b", "y", "etc"):
        assert not (tmp_path / name).exists() and not (tmp_path.parent / name).exists()


def test_file_over_the_configured_cap(grpc_server, tmp_path: Path) -> None:
    settings = PullSettings(limits=ArtifactLimits(max_file_bytes=1_000_000))
    error = attempt(grpc_server, tmp_path, lambda m, c: m, settings)
    assert isinstance(error, LimitExceeded) and error.field == "tokenizer.json"
    assert "tokenizer.json: 1759751 bytes is over the per-file cap of 1000000" in error.message


def test_total_over_the_configured_cap(grpc_server, tmp_path: Path) -> None:
    settings = PullSettings(limits=ArtifactLimits(max_total_bytes=1_760_000))
    error = attempt(grpc_server, tmp_path, lambda m, c: m, settings)
    assert isinstance(error, LimitExceeded) and "total cap of 1760000" in error.message


def test_stream_ending_early(grpc_server, tmp_path: Path) -> None:
    error = attempt(grpc_server, tmp_path, lambda m, c: m[: data_indices(m)[6]])
    assert_fault(error, "tokenizer.json", "truncated")
    assert f"tokenizer.json at byte {6 * CHUNK} of 1759751" in error.message


def test_connection_lost_for_good(grpc_server, tmp_path: Path) -> None:
    def always_drop(messages, call):  # noqa: ANN001, ANN202
        cut = data_indices(messages)[1]
        return [*messages[:cut], Abort(grpc.StatusCode.UNAVAILABLE, "connection reset")]

    error = attempt(grpc_server, tmp_path, always_drop)
    assert isinstance(error, Unavailable) and error.field == "tokenizer.json"
    assert error.details["fault"] == "unavailable"
    # Each of the two resumes got one more chunk through before the cut.
    assert f"transfer stopped at tokenizer.json at byte {3 * CHUNK} of" in error.message
    assert "after 2 resume attempts" in error.message


def test_server_side_failure_mid_stream(grpc_server, tmp_path: Path) -> None:
    def fail(messages, call):  # noqa: ANN001, ANN202
        cut = end_index(messages, "tokenizer.json") + 1
        return [*messages[:cut], Abort(grpc.StatusCode.INTERNAL, "disk on fire")]

    error = attempt(grpc_server, tmp_path, fail)
    assert error.field == "tokenizer_config.json" and error.details["fault"] == "internal"
    assert "tokenizer_config.json at byte 0 of 889" in error.message
    assert "disk on fire" in error.message


def test_client_deadline(grpc_server, tmp_path: Path) -> None:
    def stall(messages, call):  # noqa: ANN001, ANN202
        cut = data_indices(messages)[3]
        return [*messages[:cut], Stall(60), *messages[cut:]]

    settings = PullSettings(chunk_size=CHUNK, timeout=1.0)
    error = attempt(grpc_server, tmp_path, stall, settings)
    assert isinstance(error, DeadlineExceeded) and error.field == "tokenizer.json"
    assert error.details["fault"] == "deadline_exceeded"
    assert f"tokenizer.json at byte {3 * CHUNK} of 1759751" in error.message


async def test_client_interrupt_cancels_and_cleans_up(grpc_server, tmp_path: Path) -> None:
    def stall(messages, call):  # noqa: ANN001, ANN202
        cut = data_indices(messages)[2]
        return [*messages[:cut], Stall(60), *messages[cut:]]

    registry, _ = served(TOKENIZER, stall)
    server = grpc_server(registry)
    cache = tmp_path / "cache"
    arrived = asyncio.Event()
    task = asyncio.create_task(
        pull_async(
            server.target,
            cache=cache,
            settings=SETTINGS,
            progress=lambda p: arrived.set() if p.done == 2 * CHUNK else None,
        )
    )
    await asyncio.wait_for(arrived.wait(), 30)
    assert len(leftovers(cache)) == 2, "a partial folder holding tokenizer.json exists"
    task.cancel()
    with pytest.raises(asyncio.CancelledError) as info:
        await task
    assert f"cancelled at tokenizer.json at byte {2 * CHUNK} of 1759751" in str(info.value)
    assert leftovers(cache) == []
