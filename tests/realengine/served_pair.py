"""vLLM and ``tokenkeys serve`` side by side on the same tokenizer folder, for parity tests.

``tokenkeys serve --backend transformers5`` serves the embedded SmolLM2 folder under the name vLLM
serves the tiny model with (whose tokenizer files are copies of that folder), with vLLM's
``max_model_len`` and block size, as a router or sidecar in front of that vLLM would.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

from support import REPO
from vllm_server import BLOCK_SIZE, MAX_MODEL_LEN, MODEL_NAME, VllmServer, free_port

EMBEDDED = REPO / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"
SERVE_ARGS = (
    "--model", f"{MODEL_NAME}={EMBEDDED}",
    "--backend", "transformers5",
    "--max-model-len", str(MAX_MODEL_LEN),
    "--block-size", str(BLOCK_SIZE),
    "--cache-key-profile", "vllm/sha256_cbor@0.31",
)  # fmt: skip


class TokenkeysServe:
    """``tokenkeys serve`` of this checkout as a subprocess on free loopback ports."""

    def __init__(self, *args: str, ports: tuple[int, int] | None = None) -> None:
        # ``ports``: (HTTP, gRPC) of a sidecar started again in place of another.
        self.port, self.grpc_port = ports if ports is not None else (free_port(), free_port())
        #: The gRPC address (``--worker`` of a router).
        self.target = f"127.0.0.1:{self.grpc_port}"
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        command = [sys.executable, "-m", "tokenkeys.cli", "serve", *args]
        command += ["--http-port", str(self.port), "--grpc-port", str(self.grpc_port)]
        # A file, not a pipe: an unread pipe would block the server once its logs fill it.
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=self.log
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout  # a safety net, not a criterion
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise AssertionError(self.log.read().decode(errors="replace")[-3000:])
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("tokenkeys serve never became healthy")

    def log_text(self) -> str:
        """Everything the server logged so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_exit(self, timeout: float = 120) -> int:
        """The exit status of a server expected to refuse to start."""
        return self.process.wait(timeout)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


class Pair:
    """The same request sent to vLLM and to tokenkeys."""

    def __init__(self, engine: httpx.Client, ours: httpx.Client) -> None:
        self.engine = engine
        self.ours = ours

    def both(self, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
        """(vLLM's answer, tokenkeys' answer); the body gets the served model name."""
        body = {"model": MODEL_NAME, **body}
        return (
            self.engine.post(path, json=copy.deepcopy(body)),
            self.ours.post(path, json=copy.deepcopy(body)),
        )


def ok(response: httpx.Response) -> dict:
    """The JSON of a 200 answer (fails with the body otherwise)."""
    assert response.status_code == 200, response.text
    return response.json()


def sidecar_args(vllm: VllmServer, *extra: str, url: str | None = None) -> tuple[str, ...]:
    """``tokenkeys serve`` as the sidecar of ``vllm``: its tokenizer, spec and event endpoints
    (HTTP at ``url``, a way to ``vllm``, when given)."""
    return (
        *SERVE_ARGS[:4],  # --model NAME=DIR --backend transformers5 (vLLM's tokenization)
        "--cache-key-profile", "vllm/sha256_cbor@0.31",
        "--block-size", str(BLOCK_SIZE),
        "--engine", f"vllm+{url or vllm.url}",
        "--engine-kv-events", vllm.events_endpoint,
        "--engine-kv-replay", vllm.replay_endpoint,
        "--engine-kv-topic", vllm.topic,
        *extra,
    )  # fmt: skip


@contextlib.contextmanager
def running(
    *processes: TokenkeysServe | VllmServer, timeout: float | None = None
) -> Iterator[None]:
    """Wait until every process (a sidecar or a vLLM) is healthy (each within ``timeout``
    seconds, its own default without); stop them all on leaving."""
    try:
        for process in processes:
            if timeout is None:
                process.wait_healthy()
            else:
                process.wait_healthy(timeout=timeout)
        yield
    finally:
        for process in processes:
            process.stop()


#: Seconds: a safety net for a broken engine, never a pass/fail criterion.
WAIT_LIMIT = 120.0
#: The tiny models' vocabulary (SmolLM2's tokenizer).
VOCAB = 49152


def keys_checked(url: str) -> dict[str, float]:
    """``tokenkeys_engine_keys_checked_total`` by result, from the sidecar's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts = {"match": 0.0, "mismatch": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tokenkeys_engine_keys_checked_total":
                counts[sample.labels["result"]] += sample.value
    return counts


def wait_for(condition, what: str):  # noqa: ANN001, ANN201 - a predicate and its value
    deadline = time.monotonic() + WAIT_LIMIT
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.1)
    return value


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(length)]
