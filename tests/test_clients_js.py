"""The independent JavaScript implementation (clients/js) passes every test vector.

clients/js is written from docs/cache-keys.md alone; its own `node --test` suite loads every file
of testvectors/ and the real vLLM captures in tests/data/vectors/vllm-kv-events.
"""

from __future__ import annotations

import shutil
import subprocess

from evidence import unavailable

from support import REPO

JS = REPO / "clients" / "js"


def test_node_suite_passes() -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        unavailable("Node.js 20+ and npm are needed to run clients/js")
    if not (JS / "node_modules").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS,
            check=True,
            timeout=600,
            capture_output=True,
        )
    result = subprocess.run([node, "--test"], cwd=JS, capture_output=True, text=True, timeout=600)
    tail = "\n".join(result.stdout.splitlines()[-12:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout and "# skipped 0" in result.stdout, tail
