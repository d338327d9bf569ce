"""A pool: the workers serving one model with one tokenizer and one cache-key spec.

The first worker admitted for a model defines its pool: the tokenizer fingerprint, the
cache-key spec, and from them the local tokenizer (pulled artifacts) and the key strategy.
Every later worker must advertise the same fingerprint and spec, or it is refused with a
reason (:data:`REFUSAL_REASONS`); a router that mixed them would compute keys no worker's
events carry, or tokenize differently from the engine, and every score would be silently 0.

The pool also pins which KV-cache group is indexed: the spec's first prefix-reusable group
(full attention), whose block size is the routing block. That is the group the simulated engine
keeps (``tokenkeys.engine.simulated.local``) and the one llm-d indexes
(``blockStoredEventDigestible``, llm-d-router ``pkg/kvevents/pool.go``). A hybrid model's
sliding-window groups are indexed beside it and bound the hit as vLLM's coordinator does
(``router.index.hybrid``); a group kind or block size that rule does not cover refuses the
pool, naming it, instead of routing by full attention alone as if the engine could resume it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenkeys.errors import FailedPrecondition, InvalidArgument, Unsupported
from tokenkeys.keys import CacheKeySpec, KeyContext
from tokenkeys.keys.spec import SLIDING_WINDOW
from tokenkeys.keys.strategy import KeyStrategy
from tokenkeys.preprocess import Preprocessor
from tokenkeys.router.index.hybrid import GroupLayout, layout_of
from tokenkeys.router.index.model import prompt_keys
from tokenkeys.router.ingest.ingestor import PREFIX_KINDS
from tokenkeys.router.workers.discovery import EventSource, KeySpecRef, ModelDescription
from tokenkeys.router.workers.load_view import LoadView
from tokenkeys.tokenizer import Tokenizer

#: Why a worker is not routed to, as counted in ``tokenkeys_router_workers_refused_total``.
REFUSAL_REASONS = (
    "tokenizer_fingerprint",  # another tokenizer (or tokenizer options) than the pool's
    "key_spec",  # another cache-key profile or spec fingerprint than the pool's
    "no_key_spec",  # the model advertises no cache-key spec: its hashes cannot be matched
    "no_event_source",  # no KV-event source with the pool's spec in a transport we speak
    "pool_setup",  # the pool could not be built from it (artifacts, keys not computable)
    "duplicate_instance",  # the same engine instance is already a member under another address
)
#: Transports the router subscribes to, in order of preference for ``events="auto"``.
TRANSPORTS = ("zmq", "grpc")


@dataclass(frozen=True)
class Refusal:
    """Why ``address`` was not admitted to the pool of ``model``."""

    address: str
    model: str
    reason: str
    message: str


@dataclass
class Member:
    """A ready worker of the pool and what this router knows of its load (``load_view``)."""

    address: str
    instance_id: str
    source: EventSource
    view: LoadView = field(default_factory=LoadView)
    #: False once the worker advertises its keys unverified: routed by load, never by prefix.
    keys_trusted: bool = True

    @property
    def load(self) -> float:
        """The worker's load for tie-breaks: what it reported, or what this router sent it."""
        return self.view.load


def spec_refusal(address: str, model: ModelDescription) -> Refusal | None:
    """The refusal of a model served without a cache-key spec (no pool can match its hashes)."""
    if model.key_spec is not None:
        return None
    return Refusal(
        address,
        model.name,
        "no_key_spec",
        f"worker {address} advertises no cache-key spec for model {model.name!r}, so its "
        "KV-event hashes cannot be matched; serve it with a cache-key profile",
    )


def choose_source(
    model: ModelDescription, spec: KeySpecRef, transport: str = "auto"
) -> EventSource | None:
    """The event source to follow: one whose hashes follow ``spec``, in a transport we speak."""
    wanted = TRANSPORTS if transport == "auto" else (transport,)
    for kind in wanted:
        for source in model.sources:
            if source.transport == kind and source.spec == spec:
                return source
    return None


def routing_group(spec: CacheKeySpec) -> tuple[int, int]:
    """(group index, block size) of the KV-cache group the router indexes and matches."""
    for group in spec.groups:
        if group.kind in PREFIX_KINDS:
            return group.index, group.block_size
    raise Unsupported(
        f"spec {spec.profile_id} ({spec.fingerprint[:12]}) has no prefix-reusable KV-cache "
        f"group (kinds: {[g.kind for g in spec.groups]}); precise prefix routing needs one of "
        f"{sorted(PREFIX_KINDS)}",
        field="groups",
    )


def routing_layout(spec: CacheKeySpec) -> GroupLayout:
    """The groups routing uses: the routing group and the sliding-window groups beside it.

    Unsupported for a group the hit rule cannot place: a kind that is neither prefix-reusable
    attention nor a sliding window (Mamba, chunked local attention, ...), or a sliding window
    whose block size is not the routing group's.
    """
    index, block_size = routing_group(spec)
    for group in spec.groups:
        known = group.kind in PREFIX_KINDS or group.kind == SLIDING_WINDOW
        if not known or (group.kind == SLIDING_WINDOW and group.block_size != block_size):
            raise Unsupported(
                f"spec {spec.profile_id} ({spec.fingerprint[:12]}) has KV-cache group "
                f"{group.index} of kind {group.kind!r} with {group.block_size}-token blocks; "
                f"routing can tell what the engine resumes only with full-attention groups and "
                f"sliding-window groups of the routing block size ({block_size})",
                field="groups",
            )
    return layout_of(spec.groups, index, block_size)


class Pool:
    """The workers of one model sharing one tokenizer and one cache-key spec; see the module doc.

    ``strategy`` computes the prompt's keys (locally once the spec's vectors pass, else through
    the engine's ComputeCacheKeys). ``chat_reproducible`` is False when the engine renders chat
    with a server-side template override the artifacts do not carry (its digest is in the
    tokenizer options): chat requests are then refused rather than tokenized differently.
    """

    def __init__(
        self,
        name: str,
        key_spec: KeySpecRef,
        tokenizer: Tokenizer,
        preprocessor: Preprocessor,
        strategy: KeyStrategy,
        *,
        max_context_length: int | None = None,
        transport: str = "auto",
    ) -> None:
        if strategy.spec is None or strategy.decision.mode == "refused":
            raise FailedPrecondition(
                f"keys of model {name!r} cannot be computed: {strategy.decision.reason}",
                field="key_spec",
            )
        if strategy.spec.fingerprint != key_spec.spec_fingerprint:
            raise FailedPrecondition(
                f"the spec fetched for model {name!r} has fingerprint "
                f"{strategy.spec.fingerprint!r}, discovery advertised "
                f"{key_spec.spec_fingerprint!r}; rediscover the worker",
                field="key_spec",
            )
        if transport not in ("auto", *TRANSPORTS):
            raise InvalidArgument(
                f"event transport {transport!r} is not one of auto, {', '.join(TRANSPORTS)}",
                field="events",
            )
        self.name = name
        self.fingerprint = tokenizer.fingerprint
        self.key_spec = key_spec
        self.tokenizer = tokenizer
        self.preprocessor = preprocessor
        self.strategy = strategy
        self.spec: CacheKeySpec = strategy.spec
        self.max_context_length = max_context_length
        self.transport = transport
        self.chat_reproducible = tokenizer.options.chat_template_sha256 is None
        self.layout = routing_layout(self.spec)
        self.group_idx, self.block_size = self.layout.routing_group, self.layout.block_size
        # The context the engine hashes a request with (tokenkeys.engine.simulated.local.resolve):
        # the model name where the profile keys it, the group when it spans several hash units.
        self._needs_model = "model" in self.spec.required_context
        self._group = self.group_idx if self.block_size != self.spec.hash_unit else None
        self.members: dict[str, Member] = {}

    # --- admission -------------------------------------------------------------------------

    def refusal(self, address: str, instance_id: str, model: ModelDescription) -> Refusal | None:
        """Why ``model`` as served at ``address`` (engine ``instance_id``) may not join, or None."""
        if model.fingerprint != self.fingerprint:
            return Refusal(
                address,
                self.name,
                "tokenizer_fingerprint",
                f"worker {address} serves model {self.name!r} with tokenizer fingerprint "
                f"{model.fingerprint[:16]}..., the pool's is {self.fingerprint[:16]}...; deploy "
                "the same tokenizer revision and options on every worker of a model",
            )
        missing = spec_refusal(address, model)
        if missing is not None:
            return missing
        if model.key_spec != self.key_spec:
            return Refusal(
                address,
                self.name,
                "key_spec",
                f"worker {address} keys model {self.name!r} with {model.key_spec.profile_id} "
                f"(spec {model.key_spec.spec_fingerprint[:12]}), the pool with "
                f"{self.key_spec.profile_id} (spec {self.key_spec.spec_fingerprint[:12]}); "
                "configure the same cache-key profile, block size and seed on every worker",
            )
        if choose_source(model, self.key_spec, self.transport) is None:
            kinds = sorted({s.transport for s in model.sources}) or ["none"]
            return Refusal(
                address,
                self.name,
                "no_event_source",
                f"worker {address} has no KV-event source for model {self.name!r} with spec "
                f"{self.key_spec.spec_fingerprint[:12]} over {self.transport} (it advertises: "
                f"{', '.join(kinds)}); enable KV events on the engine",
            )
        for member in self.members.values():
            if member.address != address and member.instance_id == instance_id:
                return Refusal(
                    address,
                    self.name,
                    "duplicate_instance",
                    f"worker {address} is the engine instance already routed to as "
                    f"{member.address}; list each engine once",
                )
        return None

    def join(
        self, address: str, instance_id: str, source: EventSource, *, keys_trusted: bool = True
    ) -> Member:
        """Make ``address`` a ready member (its index entries must have been cleared)."""
        member = Member(address, instance_id, source, keys_trusted=keys_trusted)
        self.members[address] = member
        return member

    def leave(self, address: str) -> Member | None:
        """Stop routing to ``address``."""
        return self.members.pop(address, None)

    def index_id(self, address: str) -> str:
        """The worker id of ``address``'s entries for this model in the prefix index."""
        return index_worker_id(address, self.name)

    def candidates(self) -> dict[str, float]:
        """Ready members and their loads (what the scorer takes)."""
        return {a: m.load for a, m in self.members.items()}

    def untrusted(self) -> set[str]:
        """Ready members whose keys are unverified (their prefix matches are not believed)."""
        return {a for a, m in self.members.items() if not m.keys_trusted}

    def kv_usage(self, address: str) -> float:
        """The polled KV-cache usage of a member (0 when unknown)."""
        member = self.members.get(address)
        return member.view.kv_usage if member is not None else 0.0

    # --- keys --------------------------------------------------------------------------------

    def key_context(self, context: KeyContext | None) -> KeyContext | None:
        """The request's key context completed as the engine completes it."""
        changes: dict[str, object] = {}
        if self._needs_model and (context is None or context.model is None):
            changes["model"] = self.name
        if self._group is not None and (context is None or context.group is None):
            changes["group"] = self._group
        if not changes:
            return context
        return dataclasses.replace(context or KeyContext(), **changes)

    async def block_keys(
        self, token_ids: Sequence[int], context: KeyContext | None = None
    ) -> list[int]:
        """The prompt's index keys (one per full routing block), computed as the pool decided.

        Remote computation (ComputeCacheKeys) is a blocking call and runs on a worker thread.
        """
        ctx = self.key_context(context)
        if self.strategy.decision.mode == "local":
            # The compiled chain's buffer read as u64 words: no object per block.
            return self.strategy.compute_array(token_ids, ctx).index_keys.tolist()
        keys = await asyncio.to_thread(self.strategy.compute, token_ids, ctx)
        return prompt_keys(keys)


def index_worker_id(address: str, model: str) -> str:
    """``address@model``: a worker's id in the prefix index, one per served model.

    The form of llm-d's topic (``kv@<host:port>@<model>``): a multi-model engine has one KV
    cache per model, so a restart of one model's stream clears only that model's entries.
    """
    return f"{address}@{model}"
