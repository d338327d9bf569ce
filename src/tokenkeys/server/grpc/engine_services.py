"""The gRPC services of the engine side (``Control``, ``Inference``), ready to add to a server."""

from __future__ import annotations

from tokenkeys._gen.openengine.v1 import kv_snapshot_pb2_grpc, openengine_pb2_grpc
from tokenkeys.server.grpc.control import ControlService
from tokenkeys.server.grpc.inference import InferenceService
from tokenkeys.server.grpc.kv_snapshot import KvSnapshotService
from tokenkeys.server.grpc.server import ServiceAdder
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.serving.models import ModelRegistry


def engine_service_adders(models: ModelRegistry, runtime: EngineRuntime) -> list[ServiceAdder]:
    """Adders for ``start_grpc_server``: Control, Inference and the KV snapshots over
    ``runtime``'s engines."""
    control = ControlService(models, runtime)
    inference = InferenceService(models, runtime)
    snapshots = KvSnapshotService(models, runtime)
    return [
        lambda server: openengine_pb2_grpc.add_ControlServicer_to_server(control, server),
        lambda server: openengine_pb2_grpc.add_InferenceServicer_to_server(inference, server),
        lambda server: kv_snapshot_pb2_grpc.add_OpenEngineKvSnapshotServicer_to_server(
            snapshots, server
        ),
    ]
