"""What the sidecar takes from vLLM when the options leave it unset (engine/vllm/adopt.py, and
the image model id, engine/vllm/image_probe.py); the real vLLM's side is
tests/realengine/test_vllm_sidecar_start.py (the image model id: test_vllm_images.py)."""

from __future__ import annotations

import base64
import io

import pytest
from smolvlm_folder import build_smolvlm_folder

from tokenkeys.engine.vllm.adopt import VllmPublisher, adopted_spec, event_source, profile_for
from tokenkeys.engine.vllm.image_probe import adopt_model_id
from tokenkeys.errors import ConfigError
from tokenkeys.keys.deployment import DEFAULT_PROFILE, KeySpecOptions, build_spec
from tokenkeys.preprocess.images import ImageOptions
from tokenkeys.preprocess.preprocessor import Preprocessor
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

# vLLM 0.32's cache_config_info labels (the fields the adoption reads).
CACHE = {"block_size": "32", "prefix_caching_hash_algo": "sha256"}


@pytest.mark.parametrize(
    ("release", "profile"),
    [
        ("0.32.0", "vllm/xxhash_cbor@0.31"),
        ("0.31.1+cpu", "vllm/xxhash_cbor@0.31"),
        ("v0.33.0rc1", "vllm/xxhash_cbor@0.31"),
        ("0.30.2", "vllm/xxhash_cbor@0.29"),
        ("0.29.0", "vllm/xxhash_cbor@0.29"),
    ],
)
def test_the_profile_is_the_newest_not_after_the_release(release: str, profile: str) -> None:
    assert profile_for("xxhash_cbor", release) == profile


@pytest.mark.parametrize(("algorithm", "release"), [("sha256", "0.28.0"), ("blake3", "0.32.0")])
def test_no_known_profile_asks_for_the_option(algorithm: str, release: str) -> None:
    with pytest.raises(ConfigError, match="give --cache-key-profile") as refused:
        profile_for(algorithm, release)
    assert refused.value.field == "cache-key-profile"


def test_unset_options_take_vllms_and_given_ones_stay() -> None:
    default = build_spec(KeySpecOptions(DEFAULT_PROFILE))
    assert default is not None
    adopted = adopted_spec(default, KeySpecOptions(profile=None), CACHE, "0.32.0")
    assert (adopted.profile_id, adopted.hash_unit) == ("vllm/sha256@0.31", 32)
    # An adopted xxhash still needs vLLM's seed: its default root is random per process.
    xxhash = {**CACHE, "prefix_caching_hash_algo": "xxhash"}
    with pytest.raises(ConfigError, match="root"):
        adopted_spec(default, KeySpecOptions(profile=None), xxhash, "0.32.0")
    seeded = adopted_spec(default, KeySpecOptions(profile=None, root_seed="0"), xxhash, "0.32.0")
    assert seeded.profile_id == "vllm/xxhash@0.31"
    # Given: kept as given (the start checks then refuse a contradiction, naming both).
    given = KeySpecOptions(profile="vllm/sha256@0.31", block_size=16)
    spec = build_spec(given)
    assert spec is not None and adopted_spec(spec, given, CACHE, "0.32.0") is spec
    only_profile = KeySpecOptions(profile="vllm/sha256_cbor@0.31")
    partly = adopted_spec(default, only_profile, CACHE, "0.32.0")
    assert (partly.profile_id, partly.hash_unit) == ("vllm/sha256_cbor@0.31", 32)


def _publisher(endpoint: str, replay: str | None = None, topic: str = "") -> dict:
    """One engine's entry of vLLM 0.32's ``/kv_event_sources`` (a ``KVEventsConfig``)."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay,
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": topic,
    }


def test_vllms_publisher_is_reached_on_the_host_of_its_http_address() -> None:
    bound = {"0": _publisher("tcp://*:5557", "tcp://*:5558", "kv")}
    assert event_source(bound, "http://10.0.0.7:8000") == VllmPublisher(
        "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv"
    )
    # An IPv6 wildcard and host; a replay endpoint bound on an address is reached there.
    ipv6 = {"0": _publisher("tcp://[::]:5557", "tcp://10.1.1.1:5558")}
    assert event_source(ipv6, "http://[fd00::7]:8000") == VllmPublisher(
        "tcp://[fd00::7]:5557", "tcp://10.1.1.1:5558", ""
    )
    assert event_source({"0": _publisher("tcp://*:5557")}, "http://h:1").replay is None


@pytest.mark.parametrize(
    ("sources", "words"),
    [
        ({}, "publishes no KV events"),
        ({"0": {**_publisher("tcp://*:1"), "enable_kv_cache_events": False}}, "no KV events"),
        ({"0": _publisher("tcp://*:1"), "1": _publisher("tcp://*:2")}, "2 KV-event streams"),
        # vLLM connects a publisher with a host to it: someone else binds there.
        ({"0": _publisher("tcp://10.0.0.9:5557")}, "does not bind on a wildcard host"),
        ({"0": _publisher("ipc:///tmp/kv")}, "does not bind on a wildcard host"),
    ],
)
def test_a_publisher_that_cannot_be_named_asks_for_the_option(sources: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as refused:
        event_source(sources, "http://h:1")
    assert refused.value.field == "engine-kv-events"


#: vLLM's base model card ``root``: its ``--model`` argument as given.
ROOT = "/engines/tiny-smolvlm"
URL = "http://127.0.0.1:8000"


def _image_identifier(pre: Preprocessor) -> str | None:
    image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    image.new("RGB", (40, 30), (10, 100, 200)).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    parts = [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": url}}]
    chat = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    return pre.tokenize_chat(chat).features[0].identifier


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory):
    return build_smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))


def test_an_unset_image_model_id_is_vllms_root(vlm_folder) -> None:
    adopting = Preprocessor(Tokenizer.load(vlm_folder))
    assert _image_identifier(adopting) is None  # no model id: no identifier, no keys
    adopt_model_id(adopting, ROOT, URL)
    given = Preprocessor(Tokenizer.load(vlm_folder), images=ImageOptions(model_id=ROOT))
    assert adopting.images.model_id == ROOT
    assert _image_identifier(adopting) == _image_identifier(given) is not None
    adopt_model_id(given, ROOT, URL)  # the same one given: kept
    assert given.images.model_id == ROOT


def test_a_given_image_model_id_that_is_not_vllms_is_refused(vlm_folder) -> None:
    pre = Preprocessor(Tokenizer.load(vlm_folder), images=ImageOptions(model_id="/elsewhere"))
    with pytest.raises(ConfigError) as refused:
        adopt_model_id(pre, ROOT, URL)
    assert refused.value.field == "mm-model-id"
    assert f"--mm-model-id is '/elsewhere', vLLM at {URL} was started with --model {ROOT!r}" in (
        refused.value.message
    )
    assert pre.images.model_id == "/elsewhere"  # nothing half done


def test_a_text_model_takes_no_image_model_id() -> None:
    pre = Preprocessor(Tokenizer.load(default_tokenizer_path()))
    adopt_model_id(pre, ROOT, URL)
    assert pre.image_expander is None and pre.images.model_id is None
