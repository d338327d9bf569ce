"""Router-side clients of the tokenkeys services."""

from tokenkeys.client.tokenizer import TokenizerClient

__all__ = ["TokenizerClient"]
