"""Dynamo's standalone KV indexer (``python -m dynamo.indexer``, ai-dynamo-runtime 1.6.1) as a
subprocess on a loopback port, subscribed to engines' vLLM-wire ZMQ events.

Its interface, read from the wheel (``dynamo/indexer/main.py``, ``--help``, the request
structs in ``dynamo/_core.abi3.so``): ``POST /register {instance_id, endpoint, model_name,
block_size[, replay_endpoint]}`` subscribes to a worker's events; ``POST /query
{"token_ids": [...], "model_name": M[, "lora_name": L]}`` answers the longest prefix each worker
holds; ``GET /dump`` lists what it indexed. It recomputes its own XXH3 block hashes from each
stored block's ``token_ids`` (and ``lora_name``), so it is an independent reader of the events.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from ports import free_port


def matched_tokens(answer: dict[str, Any]) -> dict[int, int]:
    """A ``/query`` answer's worker id -> the tokens of its longest cached prefix (workers
    holding none left out)."""
    out = {}
    for wid, info in (answer.get("instances") or {}).items():
        matched = info["longest_matched"] if isinstance(info, dict) else info
        if matched:
            out[int(str(wid).split(":")[0])] = int(matched)
    return out


class DynamoIndexer:
    """One ``dynamo.indexer`` process; workers are added with :meth:`register`."""

    def __init__(self, python: Path, block_size: int, model: str) -> None:
        self.port = free_port()
        self.model = model
        self.block_size = block_size
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [str(python), "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
            stdout=self._log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        self._client = httpx.Client(base_url=self.url, timeout=30)

    def register(self, worker: int, endpoint: str, replay_endpoint: str | None) -> None:
        """``POST /register``: the worker's event endpoint and its replay endpoint, with which
        Dynamo repairs a sequence gap (a restarted publisher's opening batches included)."""
        body: dict[str, Any] = {
            "instance_id": worker,
            "endpoint": endpoint,
            "model_name": self.model,
            "block_size": self.block_size,
        }
        if replay_endpoint is not None:
            body["replay_endpoint"] = replay_endpoint
        answer = self._client.post("/register", json=body)
        assert answer.status_code < 300, answer.text

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until its HTTP server answers (a safety net, not a measurement)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"dynamo.indexer exited: {self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                self._client.get("/workers")
                return
            time.sleep(0.2)
        raise RuntimeError(f"dynamo.indexer not up after {timeout:.0f} s: {self.log()}")

    def query(
        self, token_ids: list[int], lora_name: str | None = None, cache_salt: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"token_ids": token_ids, "model_name": self.model}
        if lora_name is not None:
            body["lora_name"] = lora_name
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        answer = self._client.post("/query", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def matched_tokens(
        self, token_ids: list[int], lora_name: str | None = None, cache_salt: str | None = None
    ) -> dict[int, int]:
        """Worker id -> the tokens of its longest cached prefix (workers holding none left out)."""
        return matched_tokens(self.query(token_ids, lora_name, cache_salt))

    def dump(self) -> Any:
        return self._client.get("/dump").json()

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        self._client.close()
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._log.close()
