"""Router SDK: the prefix index (in memory or on Redis), KV-event ingestion, and scoring.

Data flows one way: a worker's KV events (``tokenkeys.events``) -> :class:`EventIngestor` ->
a :class:`PrefixIndex`; a prompt's block keys (``tokenkeys.keys.block_keys`` ->
:func:`prompt_keys`) -> :meth:`PrefixIndex.lookup` -> :func:`score_workers` -> the best worker.
"""

from tokenkeys.router.consumer import ZmqEventConsumer
from tokenkeys.router.index import PrefixIndex, PrefixMatch, index_key, prompt_keys
from tokenkeys.router.index_memory import MemoryPrefixIndex
from tokenkeys.router.index_redis import RedisPrefixIndex
from tokenkeys.router.ingest import EventIngestor, IngestMetrics
from tokenkeys.router.instrumented import InstrumentedIndex
from tokenkeys.router.scorer import DEFAULT_TIER_WEIGHTS, WorkerScore, score_workers

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "EventIngestor",
    "IngestMetrics",
    "InstrumentedIndex",
    "MemoryPrefixIndex",
    "PrefixIndex",
    "PrefixMatch",
    "RedisPrefixIndex",
    "WorkerScore",
    "ZmqEventConsumer",
    "index_key",
    "prompt_keys",
    "score_workers",
]
