"""What the sidecar checks at start about the vLLM it fronts: every conflict refuses to start.

vLLM says what it is in four places, all read before the sidecar serves anything:

- ``/version``, unless ``--kv-events-vllm-version`` names the release: the layout of the KV
  events vLLM publishes, which the sidecar decodes and publishes again
  (:func:`wire_version_of`, read before the event stream is built);
- ``/metrics`` ``vllm:cache_config_info`` (vLLM 0.32 ``CacheConfig.metrics_info``, every
  cache-config field as a label): ``block_size`` against ``--block-size``,
  ``prefix_caching_hash_algo`` against the algorithm of ``--cache-key-profile``, and
  ``enable_prefix_caching`` (without it vLLM stores no blocks and publishes no keys);
- ``/v1/models``: the served model name against ``--model NAME=DIR`` /
  ``--served-model-name`` when given (adopted otherwise, :func:`prepare`: the sidecar
  forwards under its own served name), ``max_model_len`` against ``--max-model-len`` when
  given (adopted otherwise), the adapters vLLM serves for the model (adopted), and the model
  path vLLM loaded (``root``: named when the tokenizer probe fails, and the image identifier's
  model id, :func:`~tokenkeys.engine.vllm.image_probe.adopt_model_id`);
- ``/tokenize`` of a probe text: vLLM's ids against the sidecar's tokenizer (backend), so the
  served number is vLLM's.

A conflict is a :class:`~tokenkeys.errors.ConfigError` naming the option and both values.
Before the first of them the sidecar waits for vLLM to answer ``/health``
(:func:`wait_for_vllm`, bounded by ``--engine-wait``): vLLM loads its model before it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

from tokenkeys.engine.config import EngineConfig, VllmEngineConfig
from tokenkeys.engine.hosting import report_start
from tokenkeys.engine.vllm.adopt import event_source
from tokenkeys.engine.vllm.client import VllmHttpClient, VllmModel
from tokenkeys.errors import ConfigError, InvalidArgument, NotFound, Unavailable, Unsupported
from tokenkeys.events.vllm_layout import wire_release_of
from tokenkeys.keys import Adapter, CacheKeySpec
from tokenkeys.tokenizer import Tokenizer

#: Text the probe tokenizes: ASCII, digits, a Unicode numeral after a space (where tokenizer
#: backends disagreed, issue 11), accents and a special token.
PROBE_TEXT = "Probe 12345 tokens: caf\u00e9, \u2166 and \u0661\u0662\u0663<|im_end|> done."


@dataclass(frozen=True)
class VllmFacts:
    """What the sidecar adopts from vLLM once the checks passed."""

    max_model_len: int | None
    num_blocks: int
    adapters: tuple[Adapter, ...]
    #: vLLM's ``--model`` argument as given (the base model card's ``root``).
    root: str = ""


log = logging.getLogger(__name__)

#: Seconds between two /health polls while vLLM starts, and between two progress lines.
POLL_S = 1.0
PROGRESS_S = 10.0


async def wait_for_vllm(client: VllmHttpClient, wait_s: float) -> None:
    """Return once vLLM's ``/health`` answers 200; Unavailable after ``wait_s`` seconds.

    Progress goes to the log every :data:`PROGRESS_S` seconds, with what vLLM answered, and
    each answer to the server's readiness reason (:func:`~tokenkeys.engine.hosting.report_start`:
    ``/health`` says it while the sidecar waits).
    """
    start = time.monotonic()
    shown = 0.0
    report_start(f"waiting for vLLM at {client.base_url} to answer /health")
    while (problem := await client.health()) is not None:
        report_start(f"waiting for vLLM at {client.base_url}: {problem}")
        waited = time.monotonic() - start
        if waited >= wait_s:
            raise Unavailable(
                f"{problem} after {waited:.0f} s; start vLLM first, or wait longer with "
                f"--engine-wait (now {wait_s:g} s)",
                field="engine-wait",
            )
        if waited >= shown:
            log.info(
                "waiting for vLLM at %s: %s (%.0f s of at most %g s)",
                client.base_url,
                problem,
                waited,
                wait_s,
            )
            shown += PROGRESS_S
        await asyncio.sleep(min(POLL_S, wait_s - waited))
    if shown:
        log.info("vLLM at %s answers after %.0f s", client.base_url, time.monotonic() - start)


async def wire_version_of(client: VllmHttpClient, wait_s: float = 0.0) -> str:
    """The KV-event layout release of the vLLM behind ``client``, from its ``/version``.

    A version without a known layout, or no version, refuses to start (ConfigError naming
    ``--kv-events-vllm-version``): decoding vLLM's events with a guessed layout would relay
    and check them wrongly. An unreachable vLLM stays :class:`Unavailable`, as in every check.
    """
    await wait_for_vllm(client, wait_s)
    try:
        reported = await client.version()
    except (InvalidArgument, NotFound) as exc:  # vLLM's 4xx: no such route here
        raise _layout_unknown(client, f"GET /version gave no release ({exc.message})") from None
    try:
        return wire_release_of(reported)
    except (InvalidArgument, Unsupported) as exc:
        raise _layout_unknown(client, exc.message) from None


def _layout_unknown(client: VllmHttpClient, why: str) -> ConfigError:
    return ConfigError(
        f"cannot tell the KV-event layout of vLLM at {client.base_url}: {why}; give "
        "--kv-events-vllm-version with the release whose layout its events follow",
        field="kv-events-vllm-version",
    )


async def check_vllm(
    client: VllmHttpClient,
    name: str,
    tokenizer: Tokenizer,
    spec: CacheKeySpec,
    max_model_len: int | None,
    wait_s: float = 0.0,
) -> VllmFacts:
    """Run every start check against the vLLM behind ``client`` once it answers (waiting at
    most ``wait_s`` seconds); the facts, or ConfigError."""
    await wait_for_vllm(client, wait_s)
    metrics = await client.metrics()
    cache = metrics.cache_config
    if not cache:
        raise ConfigError(
            f"vLLM at {client.base_url} publishes no vllm:cache_config_info on /metrics; "
            "cannot check its block size and hash algorithm",
            field="engine",
        )
    _check_cache_config(cache, spec)
    served = await client.models()
    base = _served_model(served, name, client.base_url)
    if max_model_len is not None and base.max_model_len not in (None, max_model_len):
        raise ConfigError(
            f"--max-model-len is {max_model_len}, vLLM's max_model_len is {base.max_model_len}",
            field="max-model-len",
        )
    await _probe_tokenize(client, name, tokenizer, base.root)
    adapters = tuple(Adapter(m.name, m.root) for m in served if m.parent == base.name)
    return VllmFacts(
        base.max_model_len or max_model_len,
        int(cache.get("num_gpu_blocks") or 0),
        adapters,
        base.root,
    )


def _check_cache_config(cache: dict[str, str], spec: CacheKeySpec) -> None:
    if cache.get("enable_prefix_caching") != "True":
        raise ConfigError(
            "vLLM runs without prefix caching (enable_prefix_caching="
            f"{cache.get('enable_prefix_caching')}); it stores no blocks to route by: start it "
            "with --enable-prefix-caching",
            field="engine",
        )
    # vLLM's block_size is its smallest group's (EngineCore._initialize_kv_caches, 0.32).
    block_size = min(g.block_size for g in spec.groups)
    if cache.get("block_size") != str(block_size):
        raise ConfigError(
            f"--block-size is {block_size}, vLLM's block_size is {cache.get('block_size')}",
            field="block-size",
        )
    if spec.engine != "vllm":
        raise ConfigError(
            f"--cache-key-profile is {spec.profile_id}, a {spec.engine} profile; vLLM hashes "
            f"with {cache.get('prefix_caching_hash_algo')} (use a vllm/... profile)",
            field="cache-key-profile",
        )
    algo = cache.get("prefix_caching_hash_algo")
    if algo != spec.algorithm:
        raise ConfigError(
            f"--cache-key-profile {spec.profile_id} hashes with {spec.algorithm}, vLLM's "
            f"prefix_caching_hash_algo is {algo}",
            field="cache-key-profile",
        )


def _served_model(served: list[VllmModel], name: str, url: str) -> VllmModel:
    bases = [m for m in served if m.parent is None]
    for entry in bases:
        if entry.name == name:
            return entry
    raise ConfigError(
        f"--model serves {name!r}, vLLM at {url} serves {[m.name for m in bases]}; name the "
        "model as vLLM's --served-model-name (--model NAME=DIR or --served-model-name), or "
        "give neither to serve it under vLLM's names",
        field="model",
    )


async def _probe_tokenize(
    client: VllmHttpClient, name: str, tokenizer: Tokenizer, root: str
) -> None:
    theirs = await client.tokenize(name, PROBE_TEXT)
    ours = list(tokenizer.encode([PROBE_TEXT], add_special_tokens=True)[0].ids)
    if ours != theirs:
        # vLLM's model path (/v1/models ``root``) is where its tokenizer came from; a folder
        # elsewhere may hold the same files, so it is named, never required.
        raise ConfigError(
            f"/tokenize of a probe text differs: --backend {tokenizer.options.backend} "
            f"gives {ours}, vLLM gives {theirs}; choose the backend of vLLM's tokenizer library "
            "(e.g. --backend transformers5) and the same tokenizer folder (vLLM serves "
            f"{root or 'its model'}; this server reads {tokenizer.folder.root})",
            field="backend",
        )


async def prepare(config: EngineConfig) -> EngineConfig:
    """What the sidecar takes from vLLM before any model's engine is built.

    Unless ``kv_events_vllm_version`` names one, the event layout is that of the release vLLM
    reports (or the start is refused): the relay decodes vLLM's events with it and the sidecar
    publishes them in it again. When the served model's name was not given
    (``VllmEngineConfig.adopt_name``), the names vLLM serves its model under
    (:func:`served_names`)."""
    vllm = config.engine
    assert isinstance(vllm, VllmEngineConfig)
    sources = vllm.kv_events is None or bool(vllm.kv_topic)
    if config.kv_events_vllm_version is not None and not vllm.adopt_name and not sources:
        return config
    client = VllmHttpClient(vllm.url)
    try:
        if sources:
            await wait_for_vllm(client, vllm.wait_s)
            config = dataclasses.replace(config, engine=await _events_of(client, vllm))
        if config.kv_events_vllm_version is None:
            version = await wire_version_of(client, vllm.wait_s)
            log.info(
                "KV events in vLLM %s's layout, the release vLLM at %s reports", version, vllm.url
            )
            config = dataclasses.replace(config, kv_events_vllm_version=version)
        if vllm.adopt_name:
            await wait_for_vllm(client, vllm.wait_s)
            config = dataclasses.replace(config, served_names=await served_names(client))
    finally:
        await client.close()
    return config


async def _events_of(client: VllmHttpClient, vllm: VllmEngineConfig) -> VllmEngineConfig:
    """``vllm`` with the publisher vLLM reports on ``/kv_event_sources`` where
    ``--engine-kv-events`` is not given; a given topic that is not vLLM's refuses the start
    (nothing would arrive)."""
    try:
        sources = await client.kv_event_sources()
    except (InvalidArgument, NotFound) as exc:  # a vLLM without the route (before 0.32)
        if vllm.kv_events is not None:
            return vllm  # nothing to check the topic against
        raise ConfigError(
            f"vLLM at {client.base_url} does not say where it publishes KV events "
            f"({exc.message}); give --engine-kv-events",
            field="engine-kv-events",
        ) from None
    if vllm.kv_events is None:
        source = event_source(sources, client.base_url)
        topic = vllm.kv_topic or source.topic
        log.info(
            "KV events from vLLM's publisher at %s (replay %s, topic %r), as vLLM at %s reports",
            source.endpoint,
            vllm.kv_replay or source.replay or "none",
            topic,
            client.base_url,
        )
        vllm = dataclasses.replace(
            vllm, kv_events=source.endpoint, kv_replay=vllm.kv_replay or source.replay,
            kv_topic=topic,
        )  # fmt: skip
    topics = {
        str(s.get("topic") or "") for s in sources.values() if s.get("enable_kv_cache_events")
    }
    if vllm.kv_topic and topics and vllm.kv_topic not in topics:
        raise ConfigError(
            f"--engine-kv-topic is {vllm.kv_topic!r}, vLLM publishes its KV events on topic "
            f"{' or '.join(repr(t) for t in sorted(topics))}",
            field="engine-kv-topic",
        )
    return vllm


async def served_names(client: VllmHttpClient) -> tuple[str, ...]:
    """The names vLLM serves its model under (its ``--served-model-name``, the first is the
    one its answers carry): the ids of ``/v1/models`` that are no adapter, in vLLM's order
    (vLLM 0.32 ``OpenAIServingModels.show_available_models``, one entry per name)."""
    names = tuple(m.name for m in await client.models() if m.parent is None)
    if not names:
        raise ConfigError(
            f"vLLM at {client.base_url} lists no model on /v1/models; name the model with "
            "--model NAME=DIR",
            field="model",
        )
    return names
