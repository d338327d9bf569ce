"""Pulls from a real server: same fingerprint, same ids; cache hits transfer nothing."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import grpc
import pytest
from faulty_streams import Abort, FaultyStreamer, data_indices, identity, leftovers

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.artifacts import ArtifactCache, PullSettings, fetch, pull
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import FailedPrecondition
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from conformance_data import data_path


def multilingual_texts() -> list[str]:
    doc = json.loads(data_path("vectors", "multilingual", "inputs.json").read_text("utf-8"))
    return [item["text"] for item in doc["inputs"]]


def source(name: str) -> ModelSource:
    if name == "default":
        return ModelSource.default()
    return ModelSource(name, data_path("tokenizers", name))


@pytest.mark.parametrize("name", ["default", "qwen2.5-instruct"])
def test_round_trip_same_fingerprint_and_ids(grpc_server, tmp_path: Path, name: str) -> None:
    texts = multilingual_texts()
    server = grpc_server(load_models([source(name)], TokenizerOptions(), Limits()))
    cache = tmp_path / "cache"
    tokenizer = pull(server.target, cache=cache, settings=PullSettings(chunk_size=256 * 1024))
    served = server.models.get(None).tokenizer
    assert tokenizer.fingerprint == served.fingerprint
    assert tokenizer.folder.root == cache / served.fingerprint
    assert tokenizer.folder.contents == served.folder.contents
    with TokenizerClient(server.target) as client:
        remote = client.tokenize(texts, expected_fingerprint=tokenizer.fingerprint)
    local = Preprocessor(tokenizer).tokenize_prompts(texts)
    assert [list(r.ids) for r in remote.results] == [r.ids for r in local]
    assert remote.fingerprint == tokenizer.fingerprint


def test_non_default_options_travel_in_the_identity(grpc_server, tmp_path: Path) -> None:
    options = TokenizerOptions(
        nul="strip", add_special_tokens_completion=False, split_special_tokens=True
    )
    server = grpc_server(load_models([ModelSource.default()], options, Limits()))
    tokenizer = pull(server.target, cache=tmp_path)
    assert tokenizer.options == options
    assert tokenizer.fingerprint == server.models.get(None).tokenizer.fingerprint
    text = "a\x00b <|im_start|>"
    with TokenizerClient(server.target) as client:
        remote = list(client.tokenize([text]).results[0].ids)
    assert remote == Preprocessor(tokenizer).tokenize_prompts([text])[0].ids


def test_second_pull_transfers_nothing(grpc_server, tmp_path: Path) -> None:
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits())
    model = models.get(None)
    counting = FaultyStreamer(model.artifacts, identity)
    models.replace(dataclasses.replace(model, artifacts=counting))
    server = grpc_server(models)
    first = fetch(server.target, cache=tmp_path)
    assert not first.from_cache and first.transferred == 1_760_640
    assert counting.calls == 1
    second = fetch(server.target, cache=tmp_path)
    assert second.from_cache and second.transferred == 0 and second.path == first.path
    assert counting.calls == 1, "no GetTokenizerArtifacts call for a cached fingerprint"
    assert pull(server.target, cache=tmp_path).fingerprint == first.fingerprint
    assert counting.calls == 1


def test_pinned_fingerprint_in_cache_needs_no_server(grpc_server, tmp_path: Path) -> None:
    server = grpc_server(load_models([ModelSource.default()], TokenizerOptions(), Limits()))
    fp = fetch(server.target, cache=tmp_path).fingerprint
    # Nothing listens on port 9 of loopback: any call would fail.
    tokenizer = pull("127.0.0.1:9", fingerprint=fp, cache=tmp_path)
    assert tokenizer.fingerprint == fp


def test_damaged_cache_entry_is_replaced(grpc_server, tmp_path: Path) -> None:
    server = grpc_server(load_models([ModelSource.default()], TokenizerOptions(), Limits()))
    first = fetch(server.target, cache=tmp_path)
    with open(first.path / "tokenizer_config.json", "ab") as f:
        f.write(b" ")
    again = fetch(server.target, cache=tmp_path)
    assert not again.from_cache and again.transferred == first.transferred
    assert ArtifactCache(tmp_path).lookup(first.fingerprint) is not None


def test_lost_connection_is_resumed_from_the_last_byte(grpc_server, tmp_path: Path) -> None:
    models = load_models([ModelSource.default()], TokenizerOptions(), Limits())
    model = models.get(None)

    def drop_once(messages, call):  # noqa: ANN001, ANN202
        if call > 1:
            return messages
        cut = data_indices(messages)[5]
        return [*messages[:cut], Abort(grpc.StatusCode.UNAVAILABLE, "connection reset")]

    flaky = FaultyStreamer(model.artifacts, drop_once)
    models.replace(dataclasses.replace(model, artifacts=flaky))
    server = grpc_server(models)
    settings = PullSettings(chunk_size=65536, resume_backoff=0.01)
    tokenizer = pull(server.target, cache=tmp_path / "c", settings=settings)
    assert tokenizer.fingerprint == model.tokenizer.fingerprint
    assert flaky.calls == 2
    resume = flaky.requests[1]
    assert resume.HasField("resume") and resume.expected_fingerprint == tokenizer.fingerprint
    assert (resume.resume.path, resume.resume.offset) == ("tokenizer.json", 5 * 65536)
    assert leftovers(tmp_path / "c")[0] == tokenizer.fingerprint


def test_other_models_are_pulled_by_name(grpc_server, tmp_path: Path) -> None:
    folder = tmp_path / "other"
    shutil.copytree(default_tokenizer_path(), folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    models = load_models(
        [ModelSource.default(), ModelSource("other", folder)], TokenizerOptions(), Limits()
    )
    server = grpc_server(models)
    tokenizer = pull(server.target, model="other", cache=tmp_path / "c")
    assert tokenizer.fingerprint == models.get("other").tokenizer.fingerprint
    assert "generation_config.json" in tokenizer.folder.contents
    with TokenizerClient(server.target) as client:
        assert client.info("other").fingerprint == tokenizer.fingerprint
    assert pb.TOKENIZER_OPERATION_ARTIFACTS in client_info_ops(server.target)


def client_info_ops(target: str) -> list[int]:
    with TokenizerClient(target) as client:
        return list(client.info().supported_operations)


def test_unwritable_cache_is_a_clear_error(grpc_server, tmp_path: Path) -> None:
    server = grpc_server(load_models([ModelSource.default()], TokenizerOptions(), Limits()))
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    with pytest.raises(FailedPrecondition, match="cannot write the tokenizer cache") as info:
        fetch(server.target, cache=not_a_folder)
    assert info.value.field == "cache"


def _png_data_url() -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 64), (10, 20, 30)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_vlms_processor_configs_travel_with_the_tokenizer(grpc_server, tmp_path: Path) -> None:
    """A multimodal model's processor configs are tokenizer files (issue 35): pulled with the
    artifacts, in the fingerprint, and a pulled folder expands images as the served one."""
    pytest.importorskip("PIL.Image")
    from smolvlm_folder import build_smolvlm_folder

    from tokenkeys.preprocess.images import ImageOptions
    from tokenkeys.tokenizer import Tokenizer

    image = {"type": "image_url", "image_url": {"url": _png_data_url()}}
    folder = build_smolvlm_folder(tmp_path / "vlm")
    configs = {"processor_config.json", "preprocessor_config.json"}
    assert configs <= {p.name for p in folder.iterdir()}
    server = grpc_server(load_models([ModelSource("vlm", folder)], TokenizerOptions(), Limits()))
    tokenizer = pull(server.target, cache=tmp_path / "cache")
    assert configs <= set(tokenizer.folder.contents)
    assert tokenizer.fingerprint == server.models.get(None).tokenizer.fingerprint
    chat = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]}
    options = ImageOptions(model_id="/m")
    pulled = Preprocessor(tokenizer, images=options).tokenize_chat(chat)
    served = Preprocessor(Tokenizer.load(folder), images=options).tokenize_chat(chat)
    assert pulled.tokens.ids == served.tokens.ids and len(pulled.features) == 1
    # Another processor setting is another tokenizer identity.
    changed = tmp_path / "vlm-changed"
    shutil.copytree(folder, changed)
    settings = json.loads((changed / "preprocessor_config.json").read_text())
    settings["do_image_splitting"] = not settings.get("do_image_splitting", True)
    (changed / "preprocessor_config.json").write_text(json.dumps(settings))
    other = load_models([ModelSource("vlm", changed)], TokenizerOptions(), Limits()).get(None)
    assert other.tokenizer.fingerprint != tokenizer.fingerprint
