"""The engine kind ``none``: a served model that renders and tokenizes but generates nothing.

``tokenkeys serve --engine none`` is the drop-in for vLLM's GPU-less ``vllm launch render``:
every model answers /v1/completions/render, /v1/chat/completions/render, /tokenize,
/detokenize, /v1/models and the gRPC ``OpenEngineTokenizer`` service (tokenization, artifacts,
cache-key spec and key computation), all from its one Preprocessor. Generation is refused with
the reason (HTTP 501). The engine states the context length render budgets are computed with
(``--max-model-len``, else the tokenizer's ``model_max_length``); it holds no state, so
``--processes N`` can scale it with no engine address.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, NoReturn

from tokenkeys.engine.protocol import EngineLoad
from tokenkeys.errors import Unsupported

if TYPE_CHECKING:
    from tokenkeys.engine.protocol import GenerateOutput, GenerationParams
    from tokenkeys.keys import Adapter, KeyContext

#: The value of ``--engine`` that serves no engine.
NO_ENGINE = "none"


class TokenizerOnlyEngine:
    """An :class:`~tokenkeys.engine.protocol.Engine` that refuses every generation."""

    def __init__(self, model: str, max_model_len: int | None) -> None:
        self.model = model
        self._max_model_len = max_model_len

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: KeyContext | None = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """Refused: this server has no engine (an async iterator, as the Protocol has it)."""
        return self._refuse()

    async def _refuse(self) -> AsyncIterator[GenerateOutput]:
        self._raise()
        yield  # pragma: no cover - makes this an async generator

    def _raise(self) -> NoReturn:
        raise Unsupported(
            f"model {self.model!r} is served tokenizer-only (--engine none): this server "
            "renders (/v1/completions/render, /v1/chat/completions/render), tokenizes and "
            "computes cache keys, and generates nothing; send generation to an engine",
            field="model",
        )

    @property
    def max_model_len(self) -> int | None:
        """The context length render budgets use."""
        return self._max_model_len

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """No LoRA adapters: they belong to an engine."""
        return ()

    async def load(self) -> EngineLoad:
        """Nothing runs here."""
        return EngineLoad()

    async def close(self) -> None:
        """Nothing to release."""
