"""What the sidecar takes from the vLLM it fronts when the command line leaves it unset.

vLLM reports its cache settings on ``/metrics`` ``vllm:cache_config_info`` (vLLM 0.32
``CacheConfig.metrics_info``, every field a label) and its release on ``/version``. The
sidecar adopts, for an option not given:

- ``--block-size``: vLLM's ``block_size``;
- ``--cache-key-profile``: the vLLM profile of vLLM's ``prefix_caching_hash_algo`` at the
  newest profile version not after vLLM's release (``vllm/<algo>@0.31`` from vLLM 0.31 on,
  where extra keys are tagged; ``@0.29`` for 0.29 and 0.30); an older release, or an algorithm
  without a profile, refuses the start naming the option to give;
- ``--max-model-len``: vLLM's ``max_model_len`` (:func:`~tokenkeys.engine.vllm.checks.check_vllm`);
- the served model name: the names of vLLM's ``/v1/models`` when ``--model`` names none
  (:func:`~tokenkeys.engine.vllm.checks.served_names`), and the LoRA adapters it lists;
- ``--engine-kv-events``, ``--engine-kv-replay``, ``--engine-kv-topic``: vLLM's publisher on
  ``/kv_event_sources`` (:func:`event_source`), the wildcard host of its bind endpoints
  replaced by the host the sidecar reaches vLLM's HTTP on;
- the KV-cache groups: learned from vLLM's own events (:mod:`~tokenkeys.engine.vllm.groups`).

A value that was given is checked against vLLM's, as before: a contradiction refuses the start
(:mod:`~tokenkeys.engine.vllm.checks`). The root (vLLM's ``PYTHONHASHSEED``) is on no route;
the start probe checks it instead.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from urllib.parse import urlsplit

from tokenkeys.errors import ConfigError
from tokenkeys.keys import CacheKeySpec
from tokenkeys.keys.deployment import DEFAULT_PROFILE, KeySpecOptions, build_spec
from tokenkeys.keys.registry import profile_ids

log = logging.getLogger(__name__)


def profile_for(algorithm: str, release: str) -> str:
    """The vLLM cache-key profile of ``algorithm`` as vLLM ``release`` hashes; ConfigError
    naming ``--cache-key-profile`` when none is known."""
    match = re.match(r"v?(\d+)\.(\d+)", release)
    versions = sorted(
        (tuple(int(n) for n in pid.rsplit("@", 1)[1].split(".")), pid)
        for pid in profile_ids()
        if pid.startswith(f"vllm/{algorithm}@")
    )
    if match is not None:
        ours = (int(match.group(1)), int(match.group(2)))
        fitting = [pid for version, pid in versions if version <= ours]
        if fitting:
            return fitting[-1]
    raise ConfigError(
        f"vLLM {release or '(release unknown)'} hashes with {algorithm!r}, for which tokenkeys "
        f"knows no profile of that release (known: {[pid for _, pid in versions] or 'none'}); "
        "give --cache-key-profile",
        field="cache-key-profile",
    )


def adopted_spec(
    spec: CacheKeySpec, given: KeySpecOptions, cache: dict[str, str], release: str
) -> CacheKeySpec:
    """``spec`` with vLLM's block size and hash algorithm where ``given`` leaves them unset."""
    options = given
    if given.block_size is None and given.kv_groups is None and cache.get("block_size"):
        options = dataclasses.replace(options, block_size=int(cache["block_size"]))
    algorithm = cache.get("prefix_caching_hash_algo")
    if given.profile is None and algorithm:
        options = dataclasses.replace(options, profile=profile_for(algorithm, release))
    if options == given:
        return spec
    options = dataclasses.replace(options, profile=options.profile or DEFAULT_PROFILE)
    adopted = build_spec(options)
    assert adopted is not None  # a profile is named
    log.info(
        "cache keys as vLLM reports them: %s, block size %d",
        adopted.profile_id,
        adopted.hash_unit,
    )
    return adopted


@dataclasses.dataclass(frozen=True)
class VllmPublisher:
    """Where the sidecar subscribes to vLLM's KV events: ``--engine-kv-events``,
    ``--engine-kv-replay`` (None: no replay) and ``--engine-kv-topic``."""

    endpoint: str
    replay: str | None
    topic: str


def event_source(sources: dict[str, dict], url: str) -> VllmPublisher:
    """The publisher of the one engine on vLLM's ``/kv_event_sources`` (``sources``, by
    data-parallel rank), as reached from here; ConfigError naming ``--engine-kv-events`` when
    there is none, several, or one this sidecar cannot tell how to reach."""
    publishing = {
        rank: s
        for rank, s in sources.items()
        if s.get("enable_kv_cache_events") and s.get("publisher", "zmq") == "zmq"
    }
    if len(publishing) != 1:
        what = "no KV events" if not publishing else f"{len(publishing)} KV-event streams"
        raise ConfigError(
            f"vLLM at {url} publishes {what} on /kv_event_sources; "
            + (
                "start it with --kv-events-config (enable_kv_cache_events, publisher zmq)"
                if not publishing
                else "give --engine-kv-events with the one this sidecar relays"
            ),
            field="engine-kv-events",
        )
    (source,) = publishing.values()
    host = urlsplit(url).hostname or "127.0.0.1"
    replay = source.get("replay_endpoint")
    return VllmPublisher(
        _reachable(str(source.get("endpoint", "")), host, url, connects=True),
        _reachable(str(replay), host, url, connects=False) if replay else None,
        str(source.get("topic") or ""),
    )


def _reachable(endpoint: str, host: str, url: str, connects: bool) -> str:
    """``endpoint`` of vLLM's publisher as this sidecar reaches it: a wildcard host is vLLM's
    (the host of its HTTP address). vLLM 0.32 binds its publisher on a wildcard endpoint and
    connects it to any other (``ZmqEventPublisher._is_bind_endpoint``), so a PUB endpoint with
    a host (``connects``) may be someone else's; its replay endpoint is always bound."""
    match = re.fullmatch(r"tcp://(\*|\[?::\]?|[^\s:/*]+):(\d{1,5})", endpoint)
    wildcard = match is not None and match.group(1).strip("[]") in ("*", "::")
    if match is None or (connects and not wildcard):
        raise ConfigError(
            f"vLLM at {url} publishes KV events on {endpoint!r}, which it does not bind on a "
            "wildcard host (tcp://*:PORT) this sidecar could name; give --engine-kv-events and "
            "--engine-kv-replay as this host reaches its publisher",
            field="engine-kv-events",
        )
    if not wildcard:
        return endpoint
    host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{match.group(2)}"
