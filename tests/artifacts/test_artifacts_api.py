"""The public surface of tokenkeys.artifacts is pinned, and the docs/api.md example runs."""

from __future__ import annotations

import re
from pathlib import Path

import tokenkeys.artifacts
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from support import REPO


def test_exports_are_pinned() -> None:
    assert sorted(tokenkeys.artifacts.__all__) == [
        "ArtifactCache",
        "ArtifactLimits",
        "ArtifactStreamer",
        "CacheEntry",
        "DEFAULT_CHUNK_SIZE",
        "Installed",
        "MAX_CHUNK_SIZE",
        "MIN_CHUNK_SIZE",
        "Manifest",
        "Progress",
        "PullSettings",
        "Receiver",
        "default_cache_dir",
        "fetch",
        "fetch_async",
        "is_safe_path",
        "path_problem",
        "pull",
        "pull_async",
    ]
    for name in tokenkeys.artifacts.__all__:
        assert getattr(tokenkeys.artifacts, name).__doc__ or name.isupper()


def test_api_doc_example_runs(grpc_server, tmp_path: Path) -> None:
    section = (REPO / "docs" / "api.md").read_text().split("## Artifacts", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    server = grpc_server(
        load_models([ModelSource("qwen", default_tokenizer_path())], TokenizerOptions(), Limits())
    )
    code = code.replace("engine-0:50051", server.target).replace(
        "/var/cache/tokenkeys", str(tmp_path)
    )
    scope: dict[str, object] = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    assert scope["tokenizer"].fingerprint == server.models.get(None).tokenizer.fingerprint  # type: ignore[attr-defined]
