"""smg's ``VllmEngine`` message and service stubs, from the pinned ``smg-grpc-proto`` release.

smg publishes its wire contract as the ``smg-grpc-proto`` wheel: the ``.proto`` files and the
Python stubs compiled from them (``smg_grpc_proto.generated``). The face imports those stubs, so
``pip install 'tokenkeys[smg]'`` is the whole set-up: nothing is compiled here, no checkout or
``grpcio-tools`` is needed. The release is pinned (what smg 1.13.0 speaks); a missing or other
release raises :class:`~tokenkeys.errors.ConfigError` naming the install command, so
``serve --vllm-engine-face`` refuses to start instead of serving half a face.
"""

from __future__ import annotations

from importlib import metadata

from tokenkeys.errors import ConfigError

#: The smg-grpc-proto release the face is written against: what smg 1.13.0 speaks.
PROTO_VERSION = "0.4.28"
_INSTALL = (
    f"pip install 'tokenkeys[smg]' (it pins smg-grpc-proto=={PROTO_VERSION}; from a checkout: "
    "pip install -e '.[smg]')"
)


def _refuse(reason: str) -> ConfigError:
    return ConfigError(
        f"the smg VllmEngine face needs smg-grpc-proto {PROTO_VERSION}: {reason}; {_INSTALL}",
        field="vllm-engine-face",
    )


try:
    _installed = metadata.version("smg-grpc-proto")
except metadata.PackageNotFoundError:
    raise _refuse("it is not installed") from None
if _installed != PROTO_VERSION:
    raise _refuse(f"{_installed} is installed")
try:
    from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
except ImportError as exc:  # installed metadata without an importable package: a broken install
    raise _refuse(f"its stubs cannot be imported ({exc})") from None

__all__ = ["PROTO_VERSION", "common_pb2", "vllm_engine_pb2", "vllm_engine_pb2_grpc"]
