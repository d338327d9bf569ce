"""Connections before they are requests: limits, the bounded HTTP protocol, gRPC options.

Modules: ``limits`` (:class:`ConnectionLimits`, the options and defaults), ``http_protocol``
(uvicorn's protocol with header, timeout and connection caps), ``direct_cycle`` (the request
cycle of the paths an app names, the router's forwarded routes, in place of uvicorn's),
``grpc_options`` (the grpc core
arguments for the same), ``accept_errors`` (accept failures logged once per interval),
``descriptors`` (the descriptor limit raised to what the caps need) and ``throttled_log`` (one
line per interval for a flood of events).
"""

from tokenkeys.transport.limits import ConnectionLimits

__all__ = ["ConnectionLimits"]
