"""vLLM 0.32's own ``--grpc`` server: the vLLM environment plus smg-grpc-servicer, built once.

``vllm serve MODEL --grpc`` imports ``smg_grpc_servicer`` (vLLM's
``entrypoints/launchers/grpc_server.py``; "gRPC mode requires smg-grpc-servicer"), which the
vLLM environment of :mod:`vllm_env` does not carry. Rather than a second 3.4 GB copy of vLLM,
this environment is a thin layer over it: a ``.pth`` file puts the vLLM environment's
site-packages on its path, and the servicer and its gRPC helpers are installed beside it
without dependencies (their requirements, grpcio and protobuf, are the vLLM environment's; the
helpers' 1.85.1 is the newest release of grpcio-reflection and grpcio-health-checking on PyPI).
The layer's recipe names the vLLM environment's folder, so a rebuilt vLLM environment gets a
new layer.
"""

from __future__ import annotations

from pathlib import Path

from cached_venv import PipInstall, RunPython, VenvRecipe, ensure_venv
from vllm_env import vllm_python

SERVICER_VERSION = "0.14.1"
PROTO_VERSION = "0.4.28"
GRPC_HELPERS_VERSION = "1.85.1"

_LAYER = """
import site, sys
from pathlib import Path
Path(site.getsitepackages()[0], "vllm-env.pth").write_text({site_packages!r} + "\\n")
"""


def _recipe(vllm: Path) -> VenvRecipe:
    site_packages = next((vllm.parent.parent / "lib").glob("python3*/site-packages"))
    return VenvRecipe(
        f"vllm-grpc-{SERVICER_VERSION}",
        steps=(
            RunPython(
                "layer over the vLLM environment", _LAYER.format(site_packages=str(site_packages))
            ),
            PipInstall(
                (
                    "--no-deps",
                    f"smg-grpc-servicer=={SERVICER_VERSION}",
                    f"smg-grpc-proto=={PROTO_VERSION}",
                    f"grpcio-reflection=={GRPC_HELPERS_VERSION}",
                    f"grpcio-health-checking=={GRPC_HELPERS_VERSION}",
                )
            ),
            RunPython(
                "import vLLM's gRPC launcher",
                "import vllm.entrypoints.launchers.grpc_server  # noqa: F401\n",
            ),
        ),
    )


def vllm_grpc_python() -> Path:
    """The layered environment's Python (builds both on first use; raises VenvUnavailable)."""
    return ensure_venv(_recipe(vllm_python()))
