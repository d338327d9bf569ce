"""``tokenkeys serve`` options of the engine side: simulated engine, KV events, remote engine."""

from __future__ import annotations

import argparse
import dataclasses
import re

from tokenkeys.cli.common import key_spec_options
from tokenkeys.engine.config import (
    DEFAULT_TOPIC,
    EngineConfig,
    KindConfig,
    LoraModule,
    RemoteConfig,
    SimulatedConfig,
    VllmEngineConfig,
    new_instance_id,
)
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.engine.tokenizer_only import NO_ENGINE
from tokenkeys.errors import ConfigError
from tokenkeys.server.runtime.loading import ModelSource

_US = 1e-6

#: The flag of each engine setting whose name differs from ``--`` + the field with dashes.
_FLAGS = {
    "target": "--engine",
    "url": "--engine",
    "kv_events": "--engine-kv-events",
    "kv_replay": "--engine-kv-replay",
    "wait_s": "--engine-wait",
}


def _flag(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _in_flags(error: ConfigError) -> ConfigError:
    """The library's refusal of a setting, said in the flags that set it."""
    # Settings named with an underscore, and the refused one, are the library's words for flags.
    named = {s for s in _SETTINGS if "_" in s} | ({error.field} if error.field else set())
    message = re.sub(
        r"\b[a-z]+(?:_[a-z]+)*\b",
        lambda m: _flag(m.group()) if m.group() in named else m.group(),
        error.message,
    )
    field = _flag(error.field).split()[0].removeprefix("--") if error.field else None
    return ConfigError(message, field=field)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Register the engine options on the ``serve`` parser, one group each."""
    _add_engine_group(parser.add_argument_group("engine (simulated, or remote with --engine)"))
    _add_latency_group(parser.add_argument_group("simulated latency"))
    _add_event_group(parser.add_argument_group("KV events (vLLM ZMQ wire format)"))


def _add_engine_group(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--engine",
        metavar="HOST:PORT",
        default=None,
        help="forward generation to this OpenEngine Inference service (token ids; this "
        "server tokenizes) instead of simulating it; vllm+http://HOST:PORT fronts a real vLLM "
        "(the sidecar: see docs/vllm.md); none: no engine at all (render, tokenize and cache "
        "keys only, generation refused: the drop-in for `vllm launch render`) (default: the "
        "simulated engine)",
    )
    g.add_argument(
        "--engine-kv-events",
        metavar="tcp://HOST:PORT",
        default=None,
        help="with --engine vllm+http://...: vLLM's KV-event publisher (its --kv-events-config "
        "endpoint, as reached from here) (default: the one vLLM reports on /kv_event_sources, "
        "with its replay endpoint and topic)",
    )
    g.add_argument(
        "--engine-kv-replay",
        metavar="tcp://HOST:PORT",
        default=None,
        help="with --engine vllm+http://...: vLLM's KV-event replay endpoint",
    )
    g.add_argument(
        "--engine-kv-topic",
        metavar="TOPIC",
        default="",
        help="with --engine vllm+http://...: vLLM's KV-event topic (default: every topic)",
    )
    g.add_argument(
        "--engine-wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="with --engine vllm+http://...: how long to wait at start for vLLM to answer "
        "/health (default 600; 0 fails at once)",
    )
    g.add_argument(
        "--no-engine-probe",
        dest="engine_probe",
        action="store_false",
        help="with --engine vllm+http://...: skip the start probe (one fresh block through "
        "vLLM whose stored hash must be tokenkeys' key, which catches a wrong --root-seed)",
    )
    g.add_argument("--num-kv-blocks", type=int, default=4096, help="KV-cache capacity in blocks")
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=16,
        metavar="N",
        help="simulated engine: max_tokens of a request that sets none (default 16; a real "
        "vLLM applies its own default)",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="prompt + max_tokens limit (default: the tokenizer's model_max_length)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="output-token seed of requests that set none"
    )
    g.add_argument(
        "--instance-id",
        default=None,
        help="id routers key this engine by (default: a fresh unique id per process)",
    )
    g.add_argument(
        "--advertise-host",
        default=None,
        help="host to advertise in discovery (default: the bind host, or this machine's "
        "primary address when binding a wildcard)",
    )
    g.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters the engine serves (vLLM spelling); the path enters vLLM 0.31+ keys",
    )


def _add_latency_group(lat: argparse._ArgumentGroup) -> None:
    lat.add_argument(
        "--prefill-us-per-token",
        type=float,
        default=LatencyModel.prefill_s_per_token / _US,
        help="simulated prefill time per uncached prompt token, microseconds",
    )
    lat.add_argument(
        "--decode-us-per-token",
        type=float,
        default=LatencyModel.decode_s_per_token / _US,
        help="simulated time per output token, microseconds",
    )
    lat.add_argument(
        "--simulate-latency",
        action="store_true",
        help="really wait the simulated times (default: report them only)",
    )


def _add_event_group(ev: argparse._ArgumentGroup) -> None:
    ev.add_argument(
        "--kv-events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="publish KV events over ZMQ (the gRPC SubscribeKvEvents stream is always on)",
    )
    ev.add_argument(
        "--kv-events-port",
        type=int,
        default=0,
        help="PUB port (0: a free port; model i uses PORT+i)",
    )
    ev.add_argument(
        "--kv-events-replay-port",
        type=int,
        default=0,
        help="ROUTER replay port (0: a free port; -1: no replay; model i uses PORT+i)",
    )
    ev.add_argument(
        "--kv-events-topic",
        default=DEFAULT_TOPIC,
        help="topic template; {address} = this server's host:port, {model} = served name",
    )
    ev.add_argument(
        "--kv-events-format",
        choices=("map", "array"),
        default=None,
        help="event encoding: map (vLLM >= 0.24) or positional array (vLLM <= 0.23); "
        "default: the form of --kv-events-vllm-version",
    )
    ev.add_argument(
        "--kv-events-vllm-version",
        default=None,
        help="vLLM release whose event layout to publish (default 0.33, 0.23 with --kv-events-"
        "format array; with --engine vllm+http://... the release that vLLM's /version reports, "
        "refused when its layout is not known)",
    )
    ev.add_argument(
        "--kv-events-buffer-steps",
        type=int,
        default=10_000,
        metavar="N",
        help="batches kept for replay requests (default 10000)",
    )
    ev.add_argument(
        "--kv-events-hwm",
        type=int,
        default=100_000,
        metavar="N",
        help="messages the PUB socket queues per subscriber before ZMQ drops (default 100000)",
    )
    ev.add_argument(
        "--kv-events-subscriber-backlog",
        type=int,
        default=10_000,
        help="batches a SubscribeKvEvents client may fall behind before its stream ends",
    )
    ev.add_argument(
        "--kv-events-join-snapshot",
        action="store_true",
        help="answer each ZMQ subscriber's (re)join with the cache's snapshot, so a subscriber "
        "kept across an engine restart drops the old run's blocks (off by default; not for "
        "hybrid models; docs/integrations.md)",
    )


def tokenizer_only(args: argparse.Namespace) -> bool:
    """``--engine none``: serve without an engine (:mod:`tokenkeys.engine.tokenizer_only`).

    LoRA adapters belong to an engine, so ``--lora-modules`` is refused with it.
    """
    if args.engine != NO_ENGINE:
        return False
    if args.lora_modules:
        raise ConfigError(
            "--lora-modules needs an engine: --engine none serves no adapters",
            field="lora-modules",
        )
    return True


def vllm_config_from(args: argparse.Namespace) -> VllmEngineConfig | None:
    """The vLLM the sidecar fronts (``--engine vllm+http://...``), or None."""
    engine = args.engine or ""
    if not engine.startswith(VllmEngineConfig.SCHEME):
        for name in ("engine_kv_events", "engine_kv_replay"):
            if getattr(args, name):
                flag = "--" + name.replace("_", "-")
                raise ConfigError(
                    f"{flag} needs --engine vllm+http://HOST:PORT (a vLLM's own events)",
                    field=flag[2:],
                )
        return None
    return VllmEngineConfig(
        engine.removeprefix(VllmEngineConfig.SCHEME),
        args.engine_kv_events,
        args.engine_kv_replay,
        args.engine_kv_topic,
        args.engine_wait,
        args.engine_probe,
        key_options=key_spec_options(args) if hasattr(args, "key_profile") else None,
        adopt_name=_model_unnamed(args),
    )


def _model_unnamed(args: argparse.Namespace) -> bool:
    """Whether the one served model has no given name (``--model DIR`` or no ``--model``, no
    ``--served-model-name``): the sidecar then serves it under vLLM's served names."""
    model = getattr(args, "model", None)
    specs = model if isinstance(model, list) else [model] if model else []
    if getattr(args, "served_model_name", None) or len(specs) > 1:
        return False
    return not any(ModelSource.parse(spec).given_name for spec in specs)


def kind_config_from(args: argparse.Namespace) -> KindConfig:
    """The settings of the engine kind ``--engine`` selects (simulated without it)."""
    vllm = vllm_config_from(args)
    if vllm is not None:
        return vllm
    if args.engine is not None:
        if re.match(r"(?i)https?://", args.engine):
            raise ConfigError(
                f"--engine {args.engine} is an HTTP address: a vLLM's OpenAI server is "
                f"--engine {VllmEngineConfig.SCHEME}{args.engine} (the sidecar), an OpenEngine "
                "gRPC engine is --engine HOST:PORT",
                field="engine",
            )
        return RemoteConfig(args.engine)
    return SimulatedConfig(
        num_kv_blocks=args.num_kv_blocks,
        latency=LatencyModel(
            prefill_s_per_token=args.prefill_us_per_token * _US,
            decode_s_per_token=args.decode_us_per_token * _US,
            sleep=args.simulate_latency,
        ),
        seed=args.seed,
        lora_modules=tuple(
            LoraModule.parse(text, i + 1) for i, text in enumerate(args.lora_modules)
        ),
        default_max_tokens=args.default_max_tokens,
    )


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration of parsed ``serve`` arguments (refusals name the flags)."""
    try:
        return _engine_config(args)
    except ConfigError as error:
        raise _in_flags(error) from None


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    replay = args.kv_events_replay_port
    return EngineConfig(
        engine=kind_config_from(args),
        max_model_len=args.max_model_len,
        kv_events=args.kv_events,
        kv_events_port=args.kv_events_port,
        kv_events_replay_port=None if replay is not None and replay < 0 else replay,
        kv_events_topic=args.kv_events_topic,
        kv_events_format=args.kv_events_format,
        kv_events_vllm_version=args.kv_events_vllm_version,
        kv_events_buffer_steps=args.kv_events_buffer_steps,
        kv_events_hwm=args.kv_events_hwm,
        kv_events_subscriber_backlog=args.kv_events_subscriber_backlog,
        kv_events_join_snapshot=args.kv_events_join_snapshot,
        instance_id=args.instance_id or new_instance_id(),
        advertise_host=args.advertise_host,
    )


#: Every setting a refusal may name: the fields of the engine configurations.
_SETTINGS = frozenset(
    f.name
    for cls in (EngineConfig, SimulatedConfig, RemoteConfig, VllmEngineConfig, LoraModule)
    for f in dataclasses.fields(cls)
)
