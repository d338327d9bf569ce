"""The C allocator setting a serving process starts with (glibc's per-thread cache).

About 40 % of a tokenizers encode is spent in glibc's malloc and free (perf, 1k tokens): the
encode allocates and frees many small strings, and glibc's per-thread cache keeps only 7
chunks of each size, so most calls reach the locked arena. A larger cache
(``glibc.malloc.tcache_count=2000``) makes the encode thread's frees cheap to reuse: 1k-token
/tokenize at 16 connections on 2 cores went from 2,090-2,150 to 2,320-2,330 requests/s
(``serve --processes 2``, wrk, quiet machine), where jemalloc by ``LD_PRELOAD`` gave
2,210-2,250. glibc reads tunables only when a process starts, so ``tokenkeys serve`` re-executes
itself once with the setting added to ``GLIBC_TUNABLES`` (the same pid; the workers of
``--processes N`` inherit it). ``TOKENKEYS_MALLOC=system`` keeps the allocator as it is, and a
``GLIBC_TUNABLES`` that already sets the cache size is left alone. On other C libraries
nothing changes.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

#: The tunable and the value set when the environment gives none.
TCACHE_COUNT = "glibc.malloc.tcache_count"
TCACHE_VALUE = 2000
#: ``TOKENKEYS_MALLOC=system`` opts out.
OPT_OUT = "TOKENKEYS_MALLOC"


def tuned_environment(env: Mapping[str, str], libc: str) -> dict[str, str] | None:
    """The environment to restart with, or None when this one is to be kept as it is."""
    if libc != "glibc" or env.get(OPT_OUT) == "system":
        return None
    current = env.get("GLIBC_TUNABLES", "")
    if TCACHE_COUNT + "=" in current:
        return None
    setting = f"{TCACHE_COUNT}={TCACHE_VALUE}"
    return {**env, "GLIBC_TUNABLES": f"{current}:{setting}" if current else setting}


def restart_tuned() -> None:
    """Re-execute this process with the tuned allocator, or return when there is nothing to do.

    Call it first thing in a command's process, before threads or servers exist.
    """
    env = tuned_environment(os.environ, platform.libc_ver()[0])
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
