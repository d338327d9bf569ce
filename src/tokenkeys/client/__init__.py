"""Router-side clients of the tokenkeys services."""

from tokenkeys.client.keys import CacheKeyClient, strategy_from_server
from tokenkeys.client.tokenizer import TokenizerClient

__all__ = ["CacheKeyClient", "TokenizerClient", "strategy_from_server"]
