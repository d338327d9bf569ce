"""smg's ``VllmEngine`` message and service stubs, or a refusal that says how to build them.

The stubs are compiled from the ``.proto`` files inside the ``smg-grpc-proto`` wheel by
``python3 scripts/gen_smg_proto.py`` into ``tokenkeys._gen_smg`` (never committed: the contract
is smg's). Importing this module without them raises :class:`~tokenkeys.errors.ConfigError`
naming both steps, so ``serve --vllm-engine-face`` refuses to start instead of serving half a face.
"""

from __future__ import annotations

from tokenkeys.errors import ConfigError

#: The smg-grpc-proto release the face is written against: what smg 1.13.0 speaks.
PROTO_VERSION = "0.4.28"
_BUILD = (
    f"pip install 'smg-grpc-proto=={PROTO_VERSION}' (or the extra: pip install -e '.[smg]'), "
    "then python3 scripts/gen_smg_proto.py"
)

try:
    from tokenkeys._gen_smg import SOURCE_VERSION, common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
except ImportError as exc:  # the build step has not run here
    raise ConfigError(
        f"the smg VllmEngine face needs stubs compiled from smg-grpc-proto {PROTO_VERSION}, "
        f"which are not built ({exc}); build them: {_BUILD}",
        field="vllm-engine-face",
    ) from None

if SOURCE_VERSION != PROTO_VERSION:
    raise ConfigError(
        f"the smg VllmEngine stubs were compiled from smg-grpc-proto {SOURCE_VERSION}; the face "
        f"is written against {PROTO_VERSION}: {_BUILD}",
        field="vllm-engine-face",
    )

__all__ = ["PROTO_VERSION", "common_pb2", "vllm_engine_pb2", "vllm_engine_pb2_grpc"]
