"""bench_routing's real-vLLM rows: two vLLM 0.32 servers behind sidecars behind the router.

The harness of ``tests/realengine`` (the tiny random-weight Llama, 32-token blocks, CPU) and
the workload of ``tests/realengine/test_vllm_routing.py``: shared system prompts of 384 tokens,
two of them holding one paragraph repeated block after block, each followed by questions over
rounds; ``tokenkeys route`` (precise, one router and two replicas) against ``--policy
round_robin``, each on fresh prompts. Reported: vLLM's own ``cached_tokens`` summed from usage,
the ratio to round robin's, and the sidecars' live key check (matches and mismatches).
Real vLLMs on two shared cores are slow: the request count is small (9 per row).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def _harness() -> None:
    for path in (ROOT / "tests", ROOT / "tests" / "realengine", ROOT / "src"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))


def vllm_section() -> str:
    """The Markdown of the real-vLLM rows, or a line saying why they did not run."""
    _harness()
    from test_vllm_routing import VERSION, route, run_workload, workers_of
    from test_vllm_sidecar import keys_checked

    from cached_venv import VenvUnavailable
    from served_pair import EMBEDDED, TokenkeysServe, sidecar_args
    from vllm_env import vllm_python
    from vllm_server import BLOCK_SIZE, ServerConfig, TinyModel, VllmServer

    title = "### Two real vLLMs behind sidecars"
    try:
        python = vllm_python()
    except VenvUnavailable as exc:
        return f"{title}\n\nNot run: no vLLM engine environment ({exc})."
    work = Path(tempfile.mkdtemp(prefix="bench-routing-vllm-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    builder = ROOT / "tests" / "realengine" / "build_tiny_model.py"
    subprocess.run(
        [str(python), str(builder), str(EMBEDDED), str(work / "model")], check=True, env=env
    )
    model = TinyModel(work / "model", None)
    for i in range(2):
        (work / f"v{i}").mkdir()
    engines = [VllmServer(python, model, ServerConfig(), work / f"v{i}") for i in range(2)]
    sidecars: list = []
    try:
        for engine in engines:
            engine.wait_healthy()
        sidecars = [TokenkeysServe(*sidecar_args(e, *VERSION)) for e in engines]
        for sidecar in sidecars:
            sidecar.wait_healthy(timeout=600)
        rows = []
        for name, policy, replicas, seed in (
            ("precise, one router", (), 1, 11),
            ("precise, two replicas", (), 2, 12),
            ("round_robin", ("--policy", "round_robin"), 1, 13),
        ):
            routers = [
                route(*workers_of(*sidecars), *policy, cache=work / f"{seed}-{i}")
                for i in range(replicas)
            ]
            opened = [r.__enter__() for r in routers]
            try:
                clients = [httpx.Client(base_url=r.url, timeout=600) for r in opened]
                cached, _ = run_workload(clients, seed, wait_prefix=not policy)
                for client in clients:
                    client.close()
            finally:
                for r in routers:
                    r.__exit__(None, None, None)
            rows.append((name, cached))
        checks = [keys_checked(s.url) for s in sidecars]
    finally:
        for sidecar in sidecars:
            sidecar.stop()
        for engine in engines:
            engine.stop()
    reference = rows[-1][1]
    lines = [
        title,
        "",
        "vLLM 0.32.0 (CPU, the tiny random-weight Llama of the real-engine tests, "
        f"{BLOCK_SIZE}-token blocks), two servers, each behind `tokenkeys serve --engine "
        "vllm+http://...`, behind `tokenkeys route`: 3 system prompts of 384 tokens (two holding "
        "one 32-token paragraph ten times), 3 rounds of one follow-up question each, fresh "
        "prompts per row. Cached tokens are vLLM's own `cached_tokens` from usage.",
        "",
        "| policy | cached tokens (vLLM) | vs round robin |",
        "| --- | ---: | ---: |",
    ]
    for name, cached in rows:
        ratio = f"{cached / reference:.2f}x" if reference else "n/a"
        lines.append(f"| {name} | {cached:,} | {ratio} |")
    matched = sum(c["match"] for c in checks)
    mismatched = sum(c["mismatch"] for c in checks)
    lines += [
        "",
        f"Live key check over the run, both sidecars: {matched:.0f} blocks matched, "
        f"{mismatched:.0f} mismatched (no sidecar advertised `keys_unverified`"
        + ("" if not mismatched else ": NOT so, see the logs")
        + ").",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(vllm_section())
