"""The engine a routing frontend generates with: route the token ids, forward them, report.

:class:`RoutedEngine` has the simulated engine's ``generate`` signature, so the OpenAI HTTP
frontend (``tokenkeys.frontend``) serves a pool through it unchanged: the frontend tokenizes
once with the pool's Preprocessor, this engine asks the
:class:`~tokenkeys.router.policy.router.Router` for a worker and forwards the ids over
``Inference.Generate`` (:class:`~tokenkeys.engine.remote.RemoteEngine`); usage, cached tokens
included, comes back from the worker as it reported it.

A worker that fails before its first token (unreachable, stopped) is reported to the registry
and the next ranked worker is tried; after the first token a failure is the client's to see.
Beside router replicas, a request that turns out to be the later copy of a new prompt a peer
placed on another worker at the same instant is moved there the same way, while no output of
it has arrived: the attempt is cancelled (the worker aborts it, as for a client that went
away) and the same request goes to the peer's worker (``router.replicas.reconcile``).
Each decision is appended to the :class:`RouteNote` of the current request (a context
variable), which the HTTP layer turns into ``x-tokenkeys-*`` response headers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenkeys.engine.protocol import EngineLoad, GenerateOutput, GenerationParams
from tokenkeys.errors import TokenkeysError, Unavailable
from tokenkeys.keys import Adapter, KeyContext
from tokenkeys.router.policy.decision import RouteDecision, RouteRequest
from tokenkeys.router.policy.router import Router
from tokenkeys.router.replicas.moves import Moved, unless_moved
from tokenkeys.router.replicas.sharing import LocalLoad, SharedLoad
from tokenkeys.router.workers.registry import WorkerRegistry


@dataclass
class RouteNote:
    """The routing of one client request: a decision per prompt, and where each one ran."""

    decisions: list[RouteDecision] = field(default_factory=list)
    #: The worker that answered each prompt (differs from the decision after a retry).
    served_by: list[str] = field(default_factory=list)
    #: Workers tried before one answered (the front door's retries).
    retries: int = 0
    #: The cached tokens expected and served (``router.forwarding.promise.Promise``).
    promise: Any = None
    #: A decision already taken for the next prompt (the front door's, when the worker it
    #: chose has no HTTP frontend): the engine uses it instead of routing again.
    preset: RouteDecision | None = None
    #: The answering worker's explanation and the prompt's full blocks, when the request
    #: asked for it (``x-tokenkeys-explain``, ``router.explain.endpoint``).
    explanation: Any = None


#: The note of the request being handled; set by the transport before generating.
current_note: contextvars.ContextVar[RouteNote | None] = contextvars.ContextVar(
    "tokenkeys_route_note", default=None
)


class RoutedEngine:
    """Generation for ``model`` on the worker ``router`` picks; see the module doc."""

    def __init__(
        self,
        router: Router,
        registry: WorkerRegistry,
        model: str,
        shared: SharedLoad | None = None,
        adapters: Callable[[str], tuple[Adapter, ...]] | None = None,
    ) -> None:
        self.router = router
        self.registry = registry
        self.model = model
        #: The LoRA adapters of a model its workers list (the front door learns them).
        self._adapters = adapters
        #: Where the other router replicas learn of this one's requests (``shared_load``).
        self.shared = shared if shared is not None else LocalLoad()

    @property
    def max_model_len(self) -> int | None:
        """The context length the pool's workers advertised."""
        pool = self.registry.pools.get(self.model)
        return pool.max_context_length if pool is not None else None

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """The adapters the pool's workers list on their HTTP frontends (learned by the front
        door); none without it: each worker then resolves the adapters it registered."""
        return self._adapters(self.model) if self._adapters is not None else ()

    async def load(self) -> EngineLoad:
        """The requests this router has in flight on the pool's workers (no block counts)."""
        pool = self.registry.pools.get(self.model)
        members = pool.members.values() if pool is not None else ()
        return EngineLoad(running=sum(m.view.inflight for m in members))

    async def close(self) -> None:
        """Nothing to release: the workers' channels belong to the registry."""

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: KeyContext | None = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """Route, forward and stream one prompt; outputs as the worker produced them."""
        ids = list(prompt_token_ids)
        note = current_note.get()
        if note is not None and note.preset is not None and note.preset.model == self.model:
            decision, note.preset = note.preset, None
        else:
            decision = await self.router.route(RouteRequest(ids, self.model, context))
        if note is not None:
            note.decisions.append(decision)
        metrics = self.router.metrics
        failures: list[str] = []
        targets = [decision.worker, *decision.fallbacks()]
        anywhere = decision.ranks_all(self.registry.pools[self.model])
        movable = True
        while targets:
            address = targets.pop(0)
            pool = self.registry.pools[self.model]
            member = pool.members.get(address)
            if member is None:
                continue
            started = False
            flight = member.view.begin(decision.keys, decision.cached_blocks(address))
            # Balanced by the stream's order only where it may go to any worker of the pool.
            self.shared.sent(self.model, address, flight, movable=movable and anywhere)
            move = self.shared.moves(flight) if movable else None
            try:
                engine = self.registry.engine(address, self.model)
                outputs = engine.generate(
                    ids, params, context, request_id=request_id, lora_name=lora_name
                )
                async with contextlib.aclosing(outputs) as stream:
                    first = anext(stream, _EMPTY)
                    try:
                        output = await (first if move is None else unless_moved(first, move))
                    except Moved as moved:  # a later copy of a new prompt: to the peer's worker
                        metrics.requests.labels(address, "moved").inc()
                        targets = moved.then(address, targets)
                        movable = False
                        continue
                    if output is not _EMPTY:
                        started = True
                        member.view.first_output(flight)
                        self.shared.answered(flight)
                        if note is not None:
                            note.served_by.append(address)
                    while output is not _EMPTY:
                        if output.finished and output.usage is not None:
                            metrics.prompt_tokens.labels(address).inc(output.usage.prompt_tokens)
                            metrics.cached_tokens.labels(address).inc(
                                output.usage.cached_prompt_tokens
                            )
                        yield output
                        output = await anext(stream, _EMPTY)
                metrics.requests.labels(address, "ok").inc()
                self.registry.refresh(address)
                return
            except Unavailable as exc:
                if started:
                    metrics.requests.labels(address, "failed").inc()
                    raise
                metrics.requests.labels(address, "retried").inc()
                failures.append(f"{address}: {exc.message}")
                self.registry.suspect(address)
            except TokenkeysError:
                metrics.requests.labels(address, "failed").inc()
                raise
            finally:
                member.view.end(flight)
                self.shared.finished(flight)
        raise Unavailable(
            f"no worker of {self.model!r} accepted the request: " + "; ".join(failures or ["none"]),
            field="model",
        )


#: The stream ended (before any output, or after the last).
_EMPTY: Any = object()
