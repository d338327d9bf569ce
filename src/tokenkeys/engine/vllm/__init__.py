"""A real vLLM as an engine, fronted by the sidecar (``tokenkeys serve --engine vllm+http://``).

Modules: ``sidecar`` (the engine: generation forwarded, KV events relayed), ``openai`` (the HTTP
pass-through: whole OpenAI requests with tokenkeys' ids), ``client`` (vLLM's HTTP API),
``checks`` (what the sidecar checks at start), ``key_check`` (vLLM's published keys against the
expected ones).
"""
