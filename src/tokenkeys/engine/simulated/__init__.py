"""The simulated engine: a paged prefix cache, deterministic output tokens and vLLM's KV events.

Modules: ``engine`` (the step loop), ``paged_cache`` (PagedPrefixCache), ``latency``
(LatencyModel), ``sampler`` (deterministic output tokens), ``event_extra_keys`` (the extra keys
vLLM writes into ``BlockStored``), ``local`` (one served model's simulated engine, with request
resolution).
"""
