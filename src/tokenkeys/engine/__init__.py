"""The simulated engine: paged prefix cache, usage, latency model and KV-event production.

Modules: ``core`` (Engine, GenerationParams, GenerateOutput), ``paged_cache``
(PagedPrefixCache), ``usage`` (Usage, SimulatedTiming), ``latency`` (LatencyModel),
``sampler`` (deterministic output tokens).
"""
