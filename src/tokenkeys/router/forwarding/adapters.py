"""The LoRA adapters the workers serve, learned from their HTTP frontends' ``/v1/models``.

OpenEngine discovery names no adapter (``ServerInfo`` carries ``max_loras`` only), but a
worker's OpenAI frontend lists each one as vLLM 0.32 lists them
(``vllm/entrypoints/openai/models/serving.py``; a tokenkeys sidecar repeats its vLLM's): a
model card whose ``parent`` is the base model and whose ``root`` is the path the adapter was
registered with. The router needs both. A request naming an adapter is served by its base
model's pool (the base model's tokenizer and Preprocessor), and vLLM 0.31+ hashes the adapter
into every block key as ``("lora", name, path)`` (the path exactly as registered), so the
router's keys for that request are the adapter's and meet the blocks vLLM stored for it
(``BlockStored.lora_name``).

The same answers carry each base model's ``root``: vLLM's ``--model`` argument, which it hashes
into every image identifier (:mod:`~tokenkeys.router.forwarding.image_ids` settles it per pool).

The lists are read when the front door starts and again every poll interval; a worker whose
frontend does not answer keeps its last list. A request naming an adapter is routed only among
the workers that list it (:meth:`WorkerAdapters.serving`): a worker without it would answer
404, as vLLM answers for a model it does not serve. An adapter two workers of a pool register with
different paths would key differently on each: it is left out (a request naming it is a 404,
as for any unknown model) and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable

from tokenkeys.frontend.generation import key_context
from tokenkeys.frontend.opening import Opened
from tokenkeys.frontend.state import adapters_of
from tokenkeys.keys import Adapter, KeyContext
from tokenkeys.router.forwarding.frontends import WorkerFrontends
from tokenkeys.router.forwarding.image_ids import listed_roots
from tokenkeys.router.forwarding.relay import Relay

log = logging.getLogger(__name__)


def listed_adapters(models: object) -> dict[str, tuple[Adapter, ...]]:
    """A ``/v1/models`` answer's adapters by base model (cards with a ``parent``)."""
    data = models.get("data") if isinstance(models, dict) else None
    out: dict[str, list[Adapter]] = {}
    for card in data if isinstance(data, list) else ():
        if not isinstance(card, dict):
            continue
        name, parent, root = card.get("id"), card.get("parent"), card.get("root")
        if isinstance(name, str) and isinstance(parent, str) and name and parent:
            path = root if isinstance(root, str) and root else None
            out.setdefault(parent, []).append(Adapter(name, path))
    return {parent: tuple(adapters) for parent, adapters in out.items()}


class WorkerAdapters:
    """The adapters of each worker's frontend, by base model; see the module doc."""

    def __init__(self, frontends: WorkerFrontends, relay: Relay) -> None:
        self._frontends = frontends
        self._relay = relay
        #: worker address -> base model -> its adapters, as last listed.
        self._listed: dict[str, dict[str, tuple[Adapter, ...]]] = {}
        #: worker address -> base model -> its root (None: the card states none).
        self._roots: dict[str, dict[str, str | None]] = {}
        self._warned: set[tuple[str, str]] = set()
        self._task: asyncio.Task | None = None

    async def refresh(self, addresses: Iterable[str]) -> None:
        """Read the adapters of every worker of ``addresses`` that has a frontend."""
        wanted = [(a, url) for a in addresses if (url := self._frontends.url(a)) is not None]
        answers = await asyncio.gather(
            *(self._relay.get_json(url + "/v1/models") for _, url in wanted),
            return_exceptions=True,
        )
        for (address, _), answer in zip(wanted, answers, strict=True):
            if not isinstance(answer, BaseException):
                self._listed[address] = listed_adapters(answer)
                self._roots[address] = listed_roots(answer)

    def start(self, addresses: Callable[[], Iterable[str]], interval: float) -> None:
        """Refresh every ``interval`` seconds over ``addresses()`` until :meth:`close`."""

        async def follow() -> None:
            while True:
                await asyncio.sleep(interval)
                await self.refresh(addresses())

        self._task = asyncio.get_running_loop().create_task(follow())

    async def close(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def of(self, model: str, members: Iterable[str]) -> tuple[Adapter, ...]:
        """The adapters of ``model`` that the workers ``members`` list, one path each."""
        found: dict[str, Adapter] = {}
        clashing: set[str] = set()
        for address in members:
            for adapter in self._listed.get(address, {}).get(model, ()):
                known = found.setdefault(adapter.name, adapter)
                if known != adapter:
                    clashing.add(adapter.name)
        for name in sorted(clashing):
            if (model, name) in self._warned:
                continue
            self._warned.add((model, name))
            log.warning(
                "LoRA adapter %r of %r is registered with different paths on the workers; "
                "vLLM keys its blocks with the path, so it is not routed",
                name,
                model,
            )
        return tuple(a for name, a in found.items() if name not in clashing)

    def roots(self, model: str) -> dict[str, str | None]:
        """The root each worker's card of ``model`` states, by address (listed workers only)."""
        return {a: r[model] for a, r in self._roots.items() if model in r}

    def serving(self, model: str, adapter: Adapter, members: Iterable[str]) -> frozenset[str]:
        """The workers of ``members`` whose frontend lists ``adapter`` (same path) for
        ``model``: the only ones a request naming it may go to."""
        return frozenset(a for a in members if adapter in self._listed.get(a, {}).get(model, ()))


def request_context(opened: Opened) -> KeyContext | None:
    """The key context of an opened request as its worker keys it: ``cache_salt``, and the
    LoRA adapter (name and registered path) when the request names one."""
    context = key_context(opened.body)
    if opened.lora is None:
        return context
    adapter = next(a for a in adapters_of(opened.model) if a.name == opened.lora)
    return dataclasses.replace(context or KeyContext(), adapter=adapter)
