"""The model id a pool's images are hashed with, learned from the workers as the sidecar learns it.

vLLM 0.32 hashes its ``--model`` argument, as given, into every image identifier its block keys
carry (:mod:`tokenkeys.keys.vllm_mm`), and lists that argument as the ``root`` of its model card
on ``/v1/models``. The sidecar adopts it from there
(:func:`tokenkeys.engine.vllm.image_probe.adopt_model_id`) and shows it as the root of its own
card; so the router reads each worker's card the same way (the poll that learns LoRA adapters,
:class:`~tokenkeys.router.forwarding.adapters.WorkerAdapters`) and keys a pool's image prompts
with the one id its workers state. A card whose root is null states none (a worker that does not
know it).

One id is never guessed: ``route --mm-model-id`` given, every stated root must be it; not
given, the stated roots must agree. No id (nobody states one), or a contradiction (logged as an
error once per set of ids), leaves the pool's image prompts without identifiers: they are routed
by load and forwarded unchanged, as any prompt the router cannot key exactly. Two paths to the
same model on two hosts are such a contradiction: their vLLMs key the same image differently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from tokenkeys.router.workers.pool import Pool

log = logging.getLogger(__name__)


def listed_roots(models: object) -> dict[str, str | None]:
    """A ``/v1/models`` answer's base models (cards without a ``parent``) and their ``root``
    (None when the card carries none)."""
    data = models.get("data") if isinstance(models, dict) else None
    out: dict[str, str | None] = {}
    for card in data if isinstance(data, list) else ():
        if not isinstance(card, dict) or card.get("parent") is not None:
            continue
        name, root = card.get("id"), card.get("root")
        if isinstance(name, str) and name:
            out[name] = root if isinstance(root, str) and root else None
    return out


class ImageModelIds:
    """Settles each pool's image model id from its workers' roots; see the module doc.

    ``given`` is ``route --mm-model-id`` (None: learned from the workers only).
    """

    def __init__(self, given: str | None = None) -> None:
        self.given = given
        self._reported: set[tuple[str, frozenset[str]]] = set()

    def settle(self, pool: Pool, roots: Callable[[str], Mapping[str, str | None]]) -> str | None:
        """The id ``pool``'s images are hashed with, given its workers' roots (``roots(model)``:
        address -> stated root, absent or None: unknown; asked only for a model that takes
        images, so a text model's requests build nothing), adopted by the pool's Preprocessor;
        None (no identifiers, no image keys) when unknown or contradicted."""
        preprocessor = pool.preprocessor
        if preprocessor.image_expander is None:
            return None
        listed = roots(pool.name)
        stated = {a: r for a in pool.members if (r := listed.get(a)) is not None}
        ids = set(stated.values()) | ({self.given} if self.given is not None else set())
        model_id = next(iter(ids)) if len(ids) == 1 else None
        if len(ids) > 1:
            self._contradiction(pool.name, stated)
        if preprocessor.images.model_id != model_id:
            log.info("images of %s hashed with model id %r", pool.name, model_id)
            preprocessor.adopt_image_model_id(model_id)
        return model_id

    def _contradiction(self, model: str, stated: Mapping[str, str]) -> None:
        key = (model, frozenset(stated.values()) | {self.given or ""})
        if key in self._reported:
            return
        self._reported.add(key)
        workers = ", ".join(f"{a}: {r!r}" for a, r in sorted(stated.items()))
        given = f"--mm-model-id {self.given!r}; " if self.given is not None else ""
        log.error(
            "the workers of %s hash images with different model ids (%sworkers' --model: %s); "
            "image prompts are routed by load until they agree",
            model,
            given,
            workers,
        )
