"""What ``tokenkeys serve`` configures about generation: the simulated engine, its KV events,
its LoRA adapters, or the remote OpenEngine engine generation is forwarded to.

Plain frozen values, checked once at start (:class:`~tokenkeys.errors.ConfigError` names the
option). The CLI spellings live in ``tokenkeys.cli.engine_options``.
"""

from __future__ import annotations

import re
import string
import uuid
from dataclasses import dataclass, field

from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.errors import ConfigError, TokenkeysError
from tokenkeys.events.vllm_codec import DEFAULT_VERSION, layout_for

#: Topic of each model's ZMQ stream unless configured: llm-d's ``kv@<host:port>@<model>``
#: (llm-d-kv-cache ``parseTopic`` splits on '@'); ``{address}`` is this server's routable gRPC
#: ``host:port``.
DEFAULT_TOPIC = "kv@{address}@{model}"
_TOPIC_FIELDS = {"address", "model"}
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
                f"--lora-modules entry {text!r} is not NAME=PATH; e.g. sql-lora=/adapters/sql",
                field="lora-modules",
            )
        return cls(name, path, lora_id)


@dataclass(frozen=True)
class VllmEngineConfig:
    """A real vLLM the sidecar fronts: ``--engine vllm+http://HOST:PORT`` and its KV events.

    ``kv_events`` is vLLM's ZMQ publisher (``--engine-kv-events tcp://HOST:PORT``, the endpoint
    of vLLM's ``--kv-events-config``), ``kv_replay`` its replay endpoint and ``kv_topic`` its
    topic ("" subscribes to every topic).
    """

    url: str
    kv_events: str
    kv_replay: str | None = None
    kv_topic: str = ""

    #: The scheme prefix that selects this engine on ``--engine``.
    SCHEME = "vllm+"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^\s/]+(:\d{1,5})?/?", self.url):
            raise ConfigError(
                f"--engine {self.SCHEME}{self.url!r} is not vllm+http://HOST:PORT",
                field="engine",
            )
        for name, value in (
            ("engine-kv-events", self.kv_events),
            ("engine-kv-replay", self.kv_replay),
        ):
            if value is not None and not re.fullmatch(r"tcp://[^\s*]+:\d{1,5}", value):
                raise ConfigError(
                    f"--{name} {value!r} is not tcp://HOST:PORT (vLLM's endpoint, with the host "
                    "this sidecar reaches it on in place of vLLM's bind wildcard '*')",
                    field=name,
                )


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
    ``remote_engine`` (``host:port``) forwards generation to an OpenEngine ``Inference``
    service instead of simulating it; ``vllm`` to a real vLLM (the sidecar).
    """

    num_kv_blocks: int = 4096
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
    latency: LatencyModel = field(default_factory=LatencyModel)
    seed: int = 0
    instance_id: str = field(default_factory=new_instance_id)
    advertise_host: str | None = None
    lora_modules: tuple[LoraModule, ...] = ()
    remote_engine: str | None = None
    vllm: VllmEngineConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1:
            raise ConfigError(
                f"--num-kv-blocks must be a positive integer, got {self.num_kv_blocks!r}",
                field="num-kv-blocks",
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(
                f"--max-model-len must be >= 1, got {self.max_model_len}", field="max-model-len"
            )
        for name, port in (
            ("kv-events-port", self.kv_events_port),
            ("kv-events-replay-port", self.kv_events_replay_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"--{name} must be in 0..65535, got {port}", field=name)
        for name, value in (
            ("kv-events-buffer-steps", self.kv_events_buffer_steps),
            ("kv-events-hwm", self.kv_events_hwm),
            ("kv-events-subscriber-backlog", self.kv_events_subscriber_backlog),
        ):
            if value < 1:
                raise ConfigError(f"--{name} must be at least 1, got {value}", field=name)
        self._check_topic()
        self.wire_version  # noqa: B018 - validates format and version together
        if not self.instance_id or len(self.instance_id) > 256:
            raise ConfigError(
                "--instance-id must be 1..256 characters (default: a fresh id per process)",
                field="instance-id",
            )
        names = [m.name for m in self.lora_modules]
        if len(set(names)) != len(names):
            raise ConfigError(f"--lora-modules names repeat: {names}", field="lora-modules")
        if self.remote_engine is not None and not re.fullmatch(
            r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):\d{1,5}", self.remote_engine
        ):
            raise ConfigError(
                f"--engine {self.remote_engine!r} is not HOST:PORT (e.g. 10.0.0.7:50051)",
                field="engine",
            )

    def _check_topic(self) -> None:
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.kv_events_topic) if f}
        except ValueError as exc:
            raise ConfigError(
                f"--kv-events-topic {self.kv_events_topic!r} is not a valid template: {exc}",
                field="kv-events-topic",
            ) from None
        unknown = sorted(fields - _TOPIC_FIELDS)
        if unknown:
            raise ConfigError(
                f"--kv-events-topic {self.kv_events_topic!r} uses {unknown}; the placeholders "
                "are {address} (this server's host:port) and {model} (the served name)",
                field="kv-events-topic",
            )

    @property
    def wire_version(self) -> str:
        """The vLLM release whose event layout ZMQ payloads follow (format and version agree)."""
        if self.kv_events_format not in (None, "map", "array"):
            raise ConfigError(
                f"--kv-events-format must be 'map' or 'array', got {self.kv_events_format!r}",
                field="kv-events-format",
            )
        version = self.kv_events_vllm_version or (
            LAST_ARRAY_VERSION if self.kv_events_format == "array" else DEFAULT_VERSION
        )
        try:
            form = layout_for(version).form
        except TokenkeysError as exc:
            raise ConfigError(exc.message, field="kv-events-vllm-version") from None
        if self.kv_events_format is not None and form != self.kv_events_format:
            raise ConfigError(
                f"vLLM {version} publishes {form}-encoded events, not {self.kv_events_format}: "
                "map form is vLLM 0.24 and later, array form 0.23 and earlier; adjust "
                "--kv-events-format or --kv-events-vllm-version",
                field="kv-events-vllm-version",
            )
        return version

    @property
    def kind(self) -> str:
        """The engine kind this configuration selects (a key of
        :data:`tokenkeys.engine.registry.KINDS`)."""
        if self.vllm is not None:
            return "vllm"
        return "remote" if self.remote_engine is not None else "simulated"

    def topic(self, address: str, model: str) -> str:
        """The ZMQ topic of ``model``'s stream."""
        return self.kv_events_topic.format(address=address, model=model)

    def ports(self, index: int) -> tuple[int, int | None]:
        """(events port, replay port or None) of the ``index``-th served model."""
        pub = self.kv_events_port + index if self.kv_events_port else 0
        replay = self.kv_events_replay_port
        if replay:
            replay += index
        return pub, replay

    def adapter(self, name: str) -> LoraModule | None:
        """The registered adapter called ``name``."""
        for module in self.lora_modules:
            if module.name == name:
                return module
        return None
