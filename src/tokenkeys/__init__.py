"""tokenkeys: tokenizer and KV prefix-cache key interoperability for LLM serving."""

__version__ = "0.1.0"
