"""smg's ``vllm.grpc.engine.VllmEngine`` face, beside OpenEngine's services on the same port.

Importing this package needs the pinned ``smg-grpc-proto`` (the ``smg`` extra), whose stubs it
uses; without it it raises ConfigError naming the install command.
"""

from __future__ import annotations

from tokenkeys.errors import ConfigError
from tokenkeys.server.grpc.server import ServiceAdder
from tokenkeys.server.grpc.vllm_engine.servicer import VllmEngineService
from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2_grpc
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry


def vllm_engine_adder(models: ModelRegistry, runtime: EngineRuntime) -> ServiceAdder:
    """The adder of the face for ``models``' one model; ConfigError for a server of several."""
    if len(models.names) != 1:
        raise ConfigError(
            f"the VllmEngine face serves one model (its requests name none); this server serves "
            f"{len(models.names)}: {', '.join(models.names)}; run one server per model",
            field="vllm-engine-face",
        )
    service = VllmEngineService(models, runtime)
    return lambda server: vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(service, server)


__all__ = ["VllmEngineService", "vllm_engine_adder"]
