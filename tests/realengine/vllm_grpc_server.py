"""vLLM 0.32's own gRPC server (``vllm serve MODEL --grpc``) on a loopback port, always stopped.

``vllm serve --grpc`` runs ``vllm.entrypoints.launchers.grpc_server.serve_grpc`` (vLLM's
``entrypoints/cli/serve.py``); the server is started through that launcher module directly,
as the vLLM console script fails on its own version lookup in the CPU distribution. It serves
smg-grpc-servicer 0.14.1's ``VllmEngineServicer`` over the same engine options as the harness's
HTTP servers (:meth:`VllmServer.engine_options`), from the layered environment of
:mod:`vllm_grpc_env`, in one process whose engine core is forked, not spawned
(``vllm_forkserver.py --run``: the pool's fork server runs the other environment). Healthy once
its ``VllmEngine.HealthCheck`` says so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import vllm_forkserver

from vllm_server import ForkedProcess, VllmServer


class VllmGrpcServer(VllmServer):
    """One running vLLM ``--grpc`` server; ``target`` is its ``host:port``."""

    @property
    def name(self) -> str:
        return f"grpc-{self.config.label}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def entry(self) -> list[str]:
        return ["-m", "vllm.entrypoints.launchers.grpc_server"]

    def _launch_process(
        self, python: Path, args: list[str], env: dict[str, str]
    ) -> subprocess.Popen | ForkedProcess:
        # ``-m MODULE ARGS`` as ``vllm_forkserver.py --run MODULE ARGS``: its engine core
        # forked saves the second import of torch and vLLM (about 10 of its 26 CPU s).
        run = [vllm_forkserver.__file__, "--run", *args[1:]]
        return super()._launch_process(python, run, env)

    def answers(self) -> bool:
        from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2, vllm_engine_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            try:
                health = stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError:
                return False
        return health.healthy
