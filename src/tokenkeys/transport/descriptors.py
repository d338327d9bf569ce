"""The process's file-descriptor limit, raised to what the connection caps may need.

Every connection is a descriptor. A soft limit below the caps turns a connection flood into
failed ``accept()`` calls and failed file opens elsewhere in the process; raising the soft limit
up to the hard one (as Go's runtime does at start since 1.19) is free, and where even the hard
limit is too low, the operator is told which numbers disagree.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tokenkeys.transport")

#: Descriptors kept for everything that is not a client connection (tokenizer files, ZMQ,
#: Redis, the event loop's own, pipes of subprocesses).
RESERVE = 256


def raise_descriptor_limit(connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE toward ``connections + RESERVE``; return the soft limit.

    Never lowers it. Where the platform has no ``resource`` module, returns 0 and does nothing.
    """
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + RESERVE
    ceiling = hard if hard != resource.RLIM_INFINITY else wanted
    target = min(max(soft, wanted), ceiling)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    if soft < wanted:
        log.warning(
            "the file-descriptor limit is %d but the connection caps allow %d connections "
            "(+%d for the rest): lower --http-max-connections / --grpc-max-connections or raise "
            "the hard limit (ulimit -n)",
            soft,
            connections,
            RESERVE,
        )
    return soft
