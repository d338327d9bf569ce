"""Router-side clients of the tokenkeys services."""

from tokenkeys.client.keys import AsyncCacheKeyClient, CacheKeyClient, strategy_from_server
from tokenkeys.client.tokenizer import TokenizerClient

__all__ = ["AsyncCacheKeyClient", "CacheKeyClient", "TokenizerClient", "strategy_from_server"]
