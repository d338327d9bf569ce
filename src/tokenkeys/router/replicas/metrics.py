"""The shared load's figures on the router's /metrics (all prefixed ``tokenkeys_router_replica_``).

- ``following``: 1 while this replica follows the shared stream, 0 while it routes on its own
  counts (Redis away, or not yet reached);
- ``peer_flights``: peers' requests in flight applied here now;
- ``changes_appended_total`` / ``batches_appended_total``: changes told to the peers and the
  ``XADD`` calls that carried them; ``changes_dropped_total``: changes not told (Redis away);
- ``concurrent_decisions_total{kind}``: pairs of decisions made here and by a peer without
  each other (``router.replicas.contention``): ``any``, ``split`` (a prefix placed on two
  workers and computed twice), ``piled`` (unrelated new prefixes on one worker);
  ``split_blocks_total``: blocks computed twice by the ``split`` pairs;
- ``reconciled_total{outcome}``: this replica's requests the stream's order sent to another
  worker (``router.replicas.reconcile``: later copies of a new prompt a peer placed elsewhere
  at the same instant, and new prompts balanced): ``moved`` there before their first output,
  ``late`` (found past it: left where they were), ``unmovable`` (that worker is not in this
  replica's pool, or the request's sender cannot move it);
- ``balanced_total``: this replica's new prompts the stream's order claimed for a less held
  worker than the one it chose (each also counted in ``reconciled_total``).

Read when scraped (a custom collector), so nothing on the decision path counts for it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenkeys.router.replicas.shared_load import RedisSharedLoad

_PREFIX = "tokenkeys_router_replica_"


class ReplicaCollector:
    """Exports one :class:`RedisSharedLoad`'s figures (module doc)."""

    def __init__(self, shared: RedisSharedLoad) -> None:
        self.shared = shared

    def collect(self) -> Iterator[Metric]:
        """The figures as they are now."""
        s, c = self.shared, self.shared.contention
        yield GaugeMetricFamily(
            _PREFIX + "following", "1 while the shared stream is followed.", value=s.following
        )
        yield GaugeMetricFamily(
            _PREFIX + "peer_flights", "Peers' requests in flight applied here.", s.peer_flights
        )
        for name, text, value in (
            ("changes_appended", "Changes told to the peer replicas.", s.appended),
            ("batches_appended", "XADD calls that carried them.", s.batches),
            ("changes_dropped", "Changes not told: Redis unreachable.", s.dropped),
            (
                "balanced",
                "New prompts the stream's order claimed for a less held worker.",
                s.reconciler.balanced,
            ),
            (
                "split_blocks",
                "Blocks computed twice by split concurrent decisions.",
                c.split_blocks,
            ),
        ):
            yield CounterMetricFamily(_PREFIX + name, text, value=value)
        pairs = CounterMetricFamily(
            _PREFIX + "concurrent_decisions",
            "Decisions made here and by a peer without each other, by kind.",
            labels=("kind",),
        )
        for kind, value in (("any", c.concurrent), ("split", c.split), ("piled", c.piled)):
            pairs.add_metric((kind,), value)
        yield pairs
        m = s.reconciler
        moves = CounterMetricFamily(
            _PREFIX + "reconciled",
            "Requests the stream's order sent to another worker (later copies, balanced new "
            "prompts), by outcome.",
            labels=("outcome",),
        )
        for outcome, value in (("moved", m.moved), ("late", m.late), ("unmovable", m.unmovable)):
            moves.add_metric((outcome,), value)
        yield moves


def register(shared: object, registry: CollectorRegistry) -> None:
    """Export ``shared``'s figures on ``registry`` when it shares through Redis."""
    if isinstance(shared, RedisSharedLoad):
        registry.register(ReplicaCollector(shared))
