"""Tokenizer artifacts: verified streaming, atomic install, content-addressed cache.

Client side: :func:`pull` (or :func:`pull_async`) returns a loaded local tokenizer whose
fingerprint equals the server's; :func:`fetch` stops at the verified cache entry;
:class:`ArtifactCache` lists and prunes revisions. Server side: :class:`ArtifactStreamer`.
"""

from tokenkeys.artifacts.cache import ArtifactCache, CacheEntry, Installed, default_cache_dir
from tokenkeys.artifacts.client import (
    Progress,
    PullSettings,
    fetch,
    fetch_async,
    pull,
    pull_async,
)
from tokenkeys.artifacts.install import Receiver
from tokenkeys.artifacts.manifest import (
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    ArtifactLimits,
    Manifest,
)
from tokenkeys.artifacts.paths import is_safe_path, path_problem
from tokenkeys.artifacts.streamer import ArtifactStreamer

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_CHUNK_SIZE",
    "MIN_CHUNK_SIZE",
    "ArtifactCache",
    "ArtifactLimits",
    "ArtifactStreamer",
    "CacheEntry",
    "Installed",
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
