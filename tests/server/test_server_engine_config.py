"""Engine configuration: checked once at start, each error naming its option."""

from __future__ import annotations

import pytest

from tokenkeys.cli import build_parser
from tokenkeys.cli.engine_options import engine_config_from
from tokenkeys.engine.config import EngineConfig, LoraModule, RemoteConfig, SimulatedConfig
from tokenkeys.errors import ConfigError


def test_defaults():
    config = EngineConfig()
    assert config.wire_version == "0.33" and config.kv_events_format is None  # 0.33's: map
    assert config.topic("10.0.0.1:50051", "m") == "kv@10.0.0.1:50051@m"
    assert config.ports(0) == (0, 0) and config.ports(3) == (0, 0)
    assert len(config.instance_id) == 32 and EngineConfig().instance_id != config.instance_id


def test_fixed_ports_are_offset_per_model_like_vllm_dp_ranks():
    config = EngineConfig(kv_events_port=5557, kv_events_replay_port=6557)
    assert config.ports(0) == (5557, 6557) and config.ports(2) == (5559, 6559)
    assert EngineConfig(kv_events_replay_port=None).ports(1) == (0, None)


@pytest.mark.parametrize(
    "fmt,version,expected",
    [
        ("map", None, "0.33"),
        (None, None, "0.33"),
        ("array", None, "0.23"),
        (None, "0.20", "0.20"),  # the format follows the version
        ("array", "0.20", "0.20"),
        ("map", "0.26", "0.26"),
    ],
)
def test_wire_format_and_version(fmt, version, expected):
    config = EngineConfig(kv_events_format=fmt, kv_events_vllm_version=version)
    assert config.wire_version == expected


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"kv_events_format": "array", "kv_events_vllm_version": "0.24"}, "map-encoded"),
        ({"kv_events_format": "map", "kv_events_vllm_version": "0.23"}, "array-encoded"),
        ({"kv_events_vllm_version": "0.9"}, "predates"),
        ({"kv_events_vllm_version": "latest"}, "not a release"),
        ({"kv_events_format": "json"}, "'map' or 'array'"),
        ({"kv_events_topic": "kv@{host}"}, "{address}"),
        ({"kv_events_topic": "kv@{"}, "template"),
        ({"engine": lambda: SimulatedConfig(num_kv_blocks=0)}, "num_kv_blocks"),
        ({"kv_events_port": 70000}, "0..65535"),
        ({"kv_events_buffer_steps": 0}, "buffer_steps"),
        ({"instance_id": ""}, "instance_id"),
        ({"engine": lambda: RemoteConfig("localhost")}, "HOST:PORT"),
        (
            {
                "engine": lambda: SimulatedConfig(
                    lora_modules=(LoraModule("a", "/x", 1), LoraModule("a", "/y", 2))
                )
            },
            "repeat",
        ),
    ],
)
def test_invalid_configuration_is_refused(kwargs, needle):
    # A kind's settings are built inside the check (they refuse themselves when built).
    with pytest.raises(ConfigError) as info:
        EngineConfig(**{k: v() if callable(v) else v for k, v in kwargs.items()})
    assert needle in info.value.message
    # The library names its settings; the flags that set them are the CLI's words.
    assert "--" not in info.value.message and "-" not in (info.value.field or "")


def test_remote_engine_addresses():
    for ok in ("127.0.0.1:50051", "engine-0.svc:7000", "[::1]:50051"):
        config = EngineConfig(engine=RemoteConfig(ok))
        assert config.kind == "remote" and config.engine == RemoteConfig(ok)


def test_cli_options_build_the_config():
    args = build_parser().parse_args(
        [
            "serve",
            "--num-kv-blocks",
            "64",
            "--no-kv-events",
            "--kv-events-replay-port",
            "-1",
            "--prefill-us-per-token",
            "50",
            "--decode-us-per-token",
            "1000",
            "--simulate-latency",
            "--seed",
            "3",
            "--instance-id",
            "w9",
            "--lora-modules",
            "a=/p/a",
            "b=/p/b",
            "--lora-modules",
            "c=/p/c",
        ]
    )
    config = engine_config_from(args)
    sim = config.engine
    assert config.kind == "simulated" and isinstance(sim, SimulatedConfig)
    assert sim.num_kv_blocks == 64 and not config.kv_events
    assert config.kv_events_replay_port is None
    assert sim.latency.prefill_s_per_token == pytest.approx(50e-6)
    assert sim.latency.decode_s_per_token == pytest.approx(1e-3)
    assert sim.latency.sleep and sim.seed == 3 and config.instance_id == "w9"
    assert [(m.name, m.path, m.lora_id) for m in sim.lora_modules] == [
        ("a", "/p/a", 1),
        ("b", "/p/b", 2),
        ("c", "/p/c", 3),
    ]
    assert engine_config_from(build_parser().parse_args(["serve"])).kind == "simulated"
