"""The content-addressed cache: verified lookups, usage records, pruning old revisions."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactCache, ArtifactStreamer, Receiver, default_cache_dir
from tokenkeys.artifacts.cache import METADATA_FILE
from tokenkeys.errors import FailedPrecondition, InvalidArgument
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path, fingerprint
from tokenkeys.tokenizer.proto import tokenizer_identity

TOKENIZER = Tokenizer.load(default_tokenizer_path())


def variant(nul: str = "keep", split: bool = False, behaviour: str | None = None) -> Tokenizer:
    """The default tokenizer's files with other options: another fingerprint, same bytes."""
    options = TokenizerOptions(nul=nul, split_special_tokens=split)  # type: ignore[arg-type]
    behaviour = behaviour or TOKENIZER.backend.behaviour
    backend = TOKENIZER.backend
    if behaviour != backend.behaviour:
        backend = SimpleNamespace(behaviour=behaviour)  # a server whose backend differs
    fp = fingerprint(TOKENIZER.folder.entries, options, behaviour)
    return dataclasses.replace(TOKENIZER, options=options, backend=backend, fingerprint=fp)


def install(cache: ArtifactCache, tok: Tokenizer, model: str | None = "m") -> str:
    streamer = ArtifactStreamer(tok, tokenizer_identity(tok))

    async def messages() -> list[pb.TokenizerArtifactChunk]:
        return [m async for m in streamer.stream(pb.GetTokenizerArtifactsRequest())]

    origin = None if model is None else (model, "host:1")
    with Receiver(cache, origin=origin) as receiver:
        for m in asyncio.run(messages()):
            receiver.feed(m)
        return receiver.install().fingerprint


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make the cache's clock advance one second per reading, so usage order is exact."""
    now = [1_000_000.0]

    def tick() -> float:
        now[0] += 1
        return now[0]

    monkeypatch.setattr("tokenkeys.artifacts.cache.time.time", tick)
    return now


def test_prune_keeps_the_latest_revision_per_model(tmp_path: Path, clock: list[float]) -> None:
    cache = ArtifactCache(tmp_path)
    a = install(cache, variant("keep"), "m")
    b = install(cache, variant("strip"), "m")
    c = install(cache, variant("keep", split=True), "n")
    assert [e.fingerprint for e in cache.entries()] == [c, b, a]
    assert cache.prune(keep_latest=2) == []
    assert cache.prune(keep=[a], dry_run=True) == []
    assert cache.prune(dry_run=True) == [a]
    # Using the old revision again for another model keeps it.
    cache.touch(a, "other", "host:2")
    assert cache.prune() == []
    assert {e.fingerprint for e in cache.entries()} == {a, b, c}
    assert set(cache.prune(everything=True, keep=[b])) == {a, c}
    assert [e.fingerprint for e in cache.entries()] == [b]


def test_entries_without_usage_stay_unless_everything(tmp_path: Path, clock: list[float]) -> None:
    cache = ArtifactCache(tmp_path)
    anon = install(cache, variant("strip"), model=None)
    used = install(cache, variant("keep"), "m")
    assert cache.prune(keep_latest=0) == [used]
    assert [e.fingerprint for e in cache.entries()] == [anon]
    assert cache.prune(everything=True) == [anon]
    assert cache.entries() == []


def test_prune_removes_leftovers_of_dead_transfers(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = int(finished.stdout)
    hour_ago = time.time() - 3600
    stale = tmp_path / f".partial-0123456789abcdef-{dead}-x1"
    fresh_dead = tmp_path / f".partial-0123456789abcdef-{dead}-x2"
    mine = tmp_path / f".partial-0123456789abcdef-{os.getpid()}-x3"
    abandoned = tmp_path / f".partial-0123456789abcdef-{os.getpid()}-x4"
    for p in (stale, fresh_dead, mine, abandoned):
        p.mkdir()
        (p / "tokenizer.json").write_text("{}")
    os.utime(stale, (hour_ago, hour_ago))
    os.utime(abandoned, (hour_ago - 86_400, hour_ago - 86_400))
    cache.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh_dead.name, mine.name])


def test_lookup_verifies_and_drops_damaged_entries(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    fp = install(cache, variant())
    hit = cache.lookup(fp)
    assert hit is not None and hit.from_cache and hit.transferred == 0
    assert hit.load().fingerprint == fp
    (tmp_path / fp / METADATA_FILE).unlink()
    assert cache.lookup(fp) is None
    assert not (tmp_path / fp).exists()
    assert cache.lookup("ab" * 32) is None


def test_loading_refuses_a_backend_that_behaves_differently(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    fp = install(cache, variant(behaviour="tokenizers/999"))
    installed = cache.lookup(fp)
    assert installed is not None, "the files verify against the server's identity"
    with pytest.raises(FailedPrecondition, match="behaviour 'tokenizers/1'.*'tokenizers/999'"):
        installed.load()


def test_fingerprints_are_checked_before_use_as_folder_names(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="64 lowercase hex"):
        ArtifactCache(tmp_path).path_of("../" + "a" * 61)


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TOKENKEYS_CACHE", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("TOKENKEYS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "tokenkeys" / "tokenizers"
