"""KV-cache events: frozen event values, wire codecs, and the ZMQ transport that moves them.

Modules: ``model`` (events, batches, SpecRef, EventSourceInfo), ``vllm_codec`` (vLLM msgpack;
``vllm_layout`` its fields by release, ``vllm_structs`` vLLM's msgspec structs),
``zmq_publisher`` / ``zmq_subscriber`` / ``zmq_endpoint`` (bytes over ZMQ, vLLM framing and
replay), ``stream`` (one engine's numbered fan-out to ZMQ and in-process subscribers).
"""
