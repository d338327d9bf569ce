"""What ``tokenkeys serve`` configures about generation: one engine kind's settings, and what
every kind shares (context limit, KV events, identity).

:class:`EngineConfig` holds the shared settings and ``engine``, the settings of one kind: a
union of :class:`SimulatedConfig`, :class:`RemoteConfig` and :class:`VllmEngineConfig`, each
naming its kind (``KIND``, a key of :data:`tokenkeys.engine.registry.KINDS`). Plain frozen
values, checked once at start: a :class:`~tokenkeys.errors.ConfigError` names the setting by
its field name (``field`` too); the CLI says it in its flags (``tokenkeys.cli.engine_options``).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import ConfigError, TokenkeysError
from tokenkeys.events.vllm_codec import DEFAULT_VERSION, layout_for
from tokenkeys.events.zmq_topic import DEFAULT_TOPIC, check_template, make_topic
from tokenkeys.keys.deployment import KeySpecOptions

#: Newest vLLM release with the positional (array) event form (map form since 0.24, PR #42892).
LAST_ARRAY_VERSION = "0.23"


def new_instance_id() -> str:
    """A fresh id, unique per process start (routers key their per-engine state by it)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class LoraModule:
    """An adapter the engine serves: vLLM ``--lora-modules name=path``; ids count from 1.

    vLLM 0.31+ hashes ``("lora", name, path)`` with the path exactly as registered, and reports
    ``lora_id`` (the integer id, assigned in registration order) and ``lora_name`` in events.
    """

    name: str
    path: str
    lora_id: int

    @classmethod
    def parse(cls, text: str, lora_id: int) -> LoraModule:
        """``NAME=PATH`` (the path is kept exactly as written)."""
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise ConfigError(
                f"lora_modules entry {text!r} is not NAME=PATH; e.g. sql-lora=/adapters/sql",
                field="lora_modules",
            )
        return cls(name, path, lora_id)


@dataclass(frozen=True)
class VllmEngineConfig:
    """A real vLLM the sidecar fronts: ``--engine vllm+http://HOST:PORT`` and its KV events.

    ``kv_events`` is vLLM's ZMQ publisher (``--engine-kv-events tcp://HOST:PORT``, the endpoint
    of vLLM's ``--kv-events-config``), ``kv_replay`` its replay endpoint and ``kv_topic`` its
    topic ("" subscribes to every topic); ``kv_events`` None takes all three from vLLM's
    ``/kv_event_sources`` at start (:func:`tokenkeys.engine.vllm.adopt.event_source`).
    ``wait_s`` bounds how long the sidecar waits at start for vLLM to answer
    (``--engine-wait``; vLLM loads its model before it serves). ``probe``:
    the start probe of one fresh block (``--no-engine-probe`` skips it). ``key_options``: the
    cache-key options as given; the profile and block size they leave unset are taken from
    vLLM (:mod:`tokenkeys.engine.vllm.adopt`); None takes nothing. ``adopt_name``: the served
    model's name was not given (``--model DIR`` or none, no ``--served-model-name``): the
    sidecar serves it under vLLM's served names.
    """

    KIND: ClassVar[str] = "vllm"
    #: The scheme prefix that selects this engine on ``--engine``.
    SCHEME: ClassVar[str] = "vllm+"

    url: str
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_topic: str = ""
    wait_s: float = 600.0
    probe: bool = True
    key_options: KeySpecOptions | None = None
    adopt_name: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^\s/]+(:\d{1,5})?/?", self.url):
            raise ConfigError(
                f"url {self.url!r} is not http://HOST:PORT (or https://)",
                field="url",
            )
        if not isinstance(self.wait_s, int | float) or self.wait_s < 0:
            raise ConfigError(
                f"wait_s must be a number of seconds >= 0, got {self.wait_s!r}", field="wait_s"
            )
        for name, value in (("kv_events", self.kv_events), ("kv_replay", self.kv_replay)):
            if value is not None and not re.fullmatch(r"tcp://[^\s*]+:\d{1,5}", value):
                raise ConfigError(
                    f"{name} {value!r} is not tcp://HOST:PORT (vLLM's endpoint, with the host "
                    "this sidecar reaches it on in place of vLLM's bind wildcard '*')",
                    field=name,
                )


@dataclass(frozen=True)
class SimulatedConfig:
    """The simulated engine: KV capacity, simulated latency, output seed, LoRA adapters, and
    ``default_max_tokens``, the output budget of a request that sets none (a real engine
    applies its own default)."""

    KIND: ClassVar[str] = "simulated"

    num_kv_blocks: int = 4096
    latency: LatencyModel = field(default_factory=LatencyModel)
    seed: int = 0
    lora_modules: tuple[LoraModule, ...] = ()
    default_max_tokens: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1:
            raise ConfigError(
                f"num_kv_blocks must be a positive integer, got {self.num_kv_blocks!r}",
                field="num_kv_blocks",
            )
        if not isinstance(self.default_max_tokens, int) or self.default_max_tokens < 1:
            raise ConfigError(
                f"default_max_tokens must be an integer >= 1, got {self.default_max_tokens!r}",
                field="default_max_tokens",
            )
        names = [m.name for m in self.lora_modules]
        if len(set(names)) != len(names):
            raise ConfigError(f"lora_modules names repeat: {names}", field="lora_modules")

    def adapter(self, name: str) -> LoraModule | None:
        """The registered adapter called ``name``."""
        for module in self.lora_modules:
            if module.name == name:
                return module
        return None


@dataclass(frozen=True)
class RemoteConfig:
    """An OpenEngine engine generation is forwarded to: ``--engine HOST:PORT``."""

    KIND: ClassVar[str] = "remote"

    target: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):\d{1,5}", self.target):
            raise ConfigError(
                f"target {self.target!r} is not HOST:PORT (e.g. 10.0.0.7:50051)",
                field="target",
            )


#: The settings of one engine kind.
KindConfig = SimulatedConfig | RemoteConfig | VllmEngineConfig


@dataclass(frozen=True)
class EngineConfig:
    """Generation settings of one server process (every served model gets its own engine).

    KV-event ports: ``0`` picks a free port; a fixed port ``p`` is used by the first model and
    ``p + i`` by the i-th (vLLM offsets data-parallel ranks the same way).
    ``kv_events_replay_port`` None disables replay. A gRPC subscriber more than
    ``kv_events_subscriber_backlog`` batches behind gets a terminal OVERLOADED message.
    ``kv_events`` False disables the ZMQ publisher only; the gRPC ``SubscribeKvEvents`` stream
    is always there. ``kv_events_format`` None is the form of ``kv_events_vllm_version``;
    ``kv_events_vllm_version`` None is 0.33 (0.23 for the array form), or, in front of a vLLM,
    the release that vLLM reports (read at start,
    :func:`~tokenkeys.engine.vllm.checks.wire_version_of`).
    ``engine`` is the kind's own settings (the simulated engine's by default).
    ``served_names``: the names the engine serves the one model under, when the kind's
    ``prepare`` took them from the engine (the vLLM sidecar: vLLM's ``/v1/models``); the
    runtime then serves the model under them (empty: the names it was loaded with).
    """

    engine: KindConfig = field(default_factory=SimulatedConfig)
    max_model_len: int | None = None
    kv_events: bool = True
    kv_events_port: int = 0
    kv_events_replay_port: int | None = 0
    kv_events_topic: str = DEFAULT_TOPIC
    kv_events_format: str | None = None
    kv_events_vllm_version: str | None = None
    kv_events_buffer_steps: int = 10_000
    kv_events_hwm: int = 100_000
    kv_events_subscriber_backlog: int = 10_000
    #: Answer each ZMQ subscriber's join with the stream's snapshot (``events.stream``).
    kv_events_join_snapshot: bool = False
    instance_id: str = field(default_factory=new_instance_id)
    advertise_host: str | None = None
    served_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(
                f"max_model_len must be >= 1, got {self.max_model_len}", field="max_model_len"
            )
        for name, port in (
            ("kv_events_port", self.kv_events_port),
            ("kv_events_replay_port", self.kv_events_replay_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be in 0..65535, got {port}", field=name)
        for name, value in (
            ("kv_events_buffer_steps", self.kv_events_buffer_steps),
            ("kv_events_hwm", self.kv_events_hwm),
            ("kv_events_subscriber_backlog", self.kv_events_subscriber_backlog),
        ):
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}", field=name)
        check_template(self.kv_events_topic)
        self.wire_version  # noqa: B018 - validates format and version together
        if not self.instance_id or len(self.instance_id) > 256:
            raise ConfigError(
                "instance_id must be 1..256 characters (default: a fresh id per process)",
                field="instance_id",
            )

    @property
    def wire_version(self) -> str:
        """The vLLM release whose event layout ZMQ payloads follow (format and version agree)."""
        if self.kv_events_format not in (None, "map", "array"):
            raise ConfigError(
                f"kv_events_format must be 'map' or 'array', got {self.kv_events_format!r}",
                field="kv_events_format",
            )
        version = self.kv_events_vllm_version or (
            LAST_ARRAY_VERSION if self.kv_events_format == "array" else DEFAULT_VERSION
        )
        try:
            form = layout_for(version).form
        except TokenkeysError as exc:
            raise ConfigError(exc.message, field="kv_events_vllm_version") from None
        if self.kv_events_format is not None and form != self.kv_events_format:
            raise ConfigError(
                f"vLLM {version} publishes {form}-encoded events, not {self.kv_events_format}: "
                "map form is vLLM 0.24 and later, array form 0.23 and earlier; adjust "
                "kv_events_format or kv_events_vllm_version",
                field="kv_events_vllm_version",
            )
        return version

    @property
    def kind(self) -> str:
        """The engine kind this configuration selects (a key of
        :data:`tokenkeys.engine.registry.KINDS`)."""
        return self.engine.KIND

    def topic(self, address: str, model: str) -> str:
        """The ZMQ topic of ``model``'s stream (refused when consumers could not split it)."""
        return make_topic(address, model, self.kv_events_topic)

    def ports(self, index: int) -> tuple[int, int | None]:
        """(events port, replay port or None) of the ``index``-th served model."""
        pub = self.kv_events_port + index if self.kv_events_port else 0
        replay = self.kv_events_replay_port
        if replay:
            replay += index
        return pub, replay
