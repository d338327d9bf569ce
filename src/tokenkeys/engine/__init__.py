"""Engines: the one interface every engine kind offers, and the simulated engine.

Modules: ``protocol`` (the :class:`Engine` Protocol and :class:`EngineLoad`), ``core`` (the
simulated engine, GenerationParams, GenerateOutput), ``paged_cache`` (PagedPrefixCache),
``usage`` (Usage, SimulatedTiming), ``latency`` (LatencyModel), ``sampler`` (deterministic
output tokens), ``proto`` / ``proto_errors`` (OpenEngine ``Generate`` messages and in-band
errors).
"""
