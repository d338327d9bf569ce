"""Cache-key profiles: versioned, byte-exact block keys of LLM engines and routers."""

from tokenkeys.keys.compute import block_key_array, block_keys
from tokenkeys.keys.context import Adapter, KeyContext, MMItem
from tokenkeys.keys.make import make_spec
from tokenkeys.keys.profile import ProfileInfo
from tokenkeys.keys.registry import get_profile, list_profiles
from tokenkeys.keys.spec import BlockKey, CacheKeySpec, KeyArray, KeyGroup, Vector

__all__ = [
    "Adapter",
    "BlockKey",
    "CacheKeySpec",
    "KeyArray",
    "KeyContext",
    "KeyGroup",
    "MMItem",
    "ProfileInfo",
    "Vector",
    "block_key_array",
    "block_keys",
    "get_profile",
    "list_profiles",
    "make_spec",
]
