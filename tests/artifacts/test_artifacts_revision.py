"""A server restarted with a changed tokenizer: stale pins fail, the new revision is pulled,
both stay cached until pruned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
from faulty_streams import leftovers

from tokenkeys._gen.openengine.v1 import generation_pb2, tokenizer_pb2_grpc
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactCache, fetch, pull
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import FailedPrecondition
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from support import ServerThread


def models(folder: Path) -> ModelRegistry:
    return load_models([ModelSource("chat", folder)], TokenizerOptions(), Limits())


def test_revision_change(grpc_server, tmp_path: Path) -> None:
    folder = tmp_path / "chat"
    shutil.copytree(default_tokenizer_path(), folder)
    cache = ArtifactCache(tmp_path / "cache")

    with ServerThread(models(folder)) as first:
        old = pull(first.target, cache=cache)

    # The operator ships a new tokenizer_config.json and restarts the server.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = 4096
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    second = grpc_server(models(folder))
    new_fp = second.models.get(None).tokenizer.fingerprint
    assert new_fp != old.fingerprint

    # Every call that names the old fingerprint is refused, carrying the new one.
    with TokenizerClient(second.target) as client, pytest.raises(FailedPrecondition) as info:
        client.tokenize(["hello"], expected_fingerprint=old.fingerprint)
    assert new_fp in info.value.message
    with grpc.insecure_channel(second.target) as channel:
        stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(channel)
        calls = [
            lambda: stub.Detokenize(
                pb.DetokenizeRequest(
                    sequences=[generation_pb2.TokenIds(ids=[1, 2])],
                    expected_fingerprint=old.fingerprint,
                )
            ),
            lambda: list(
                stub.GetTokenizerArtifacts(
                    pb.GetTokenizerArtifactsRequest(expected_fingerprint=old.fingerprint)
                )
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as rpc:
                call()
            assert rpc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert dict(rpc.value.trailing_metadata())["tokenkeys-fingerprint"] == new_fp
    # A pull pinned to the old revision is served from the cache, without the server...
    assert pull(second.target, fingerprint=old.fingerprint, cache=cache).fingerprint == (
        old.fingerprint
    )
    # ...but a cold cache cannot get it from a server that moved on.
    with pytest.raises(FailedPrecondition, match="pull the new revision"):
        fetch(second.target, fingerprint=old.fingerprint, cache=tmp_path / "cold")
    assert leftovers(tmp_path / "cold") == []

    # Pulling again fetches the new revision; both stay cached.
    new = pull(second.target, cache=cache)
    assert new.fingerprint == new_fp
    assert new.specials.model_max_length == 4096
    assert {e.fingerprint for e in cache.entries()} == {old.fingerprint, new_fp}

    # Until told to prune: the newest revision of the model stays, the old one goes.
    assert cache.prune(dry_run=True) == [old.fingerprint]
    assert {e.fingerprint for e in cache.entries()} == {old.fingerprint, new_fp}
    assert cache.prune() == [old.fingerprint]
    assert [e.fingerprint for e in cache.entries()] == [new_fp]
    assert cache.lookup(new_fp) is not None and cache.lookup(old.fingerprint) is None
