"""Engines: the one interface every engine kind offers, and every kind behind it.

Modules: ``protocol`` (the :class:`~tokenkeys.engine.protocol.Engine` Protocol and the values
every kind shares: GenerationParams, GenerateOutput, EngineLoad, Usage, SimulatedTiming),
``context_window`` (the context-length rule), ``proto`` / ``proto_errors`` (OpenEngine
``Generate`` messages and in-band errors), ``passthrough`` (engines answering whole OpenAI
requests), ``fronted`` (engines that are servers of their own: readiness, release). Kinds:
``simulated/`` (the simulated engine), ``remote`` (an OpenEngine engine over gRPC), ``vllm/`` (a
real vLLM behind the sidecar); ``tokenizer_only`` (``--engine none``: render and tokenize,
generation refused; no kind, as a tokenizer-only server has no engine configuration).
"""
