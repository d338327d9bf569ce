"""A ``VllmEngine.Generate`` request read for the served model, and its answers built.

Reading follows smg-grpc-servicer 0.14.1's ``_sampling_params_from_proto`` (what vLLM
0.32's ``--grpc`` applies): ``max_tokens`` unset is the engine's default, ``stop_token_ids``
and the EOS ids stop generation unless ``ignore_eos``, ``seed`` and the distribution knobs are
kept (they reach a real vLLM; the simulated engine draws the same tokens whatever they are).
Text input goes through the model's Preprocessor (the one path; vLLM tokenizes a text prompt
with special tokens, as our completions path does). What the Engine Protocol cannot carry
exactly is refused with UNIMPLEMENTED naming the field: several outputs (``n``), logprobs,
structured outputs, stop strings, ``min_tokens``, logit bias, prompt truncation, multimodal
inputs and media, KV transfer (disaggregated prefill/decode).

Answers follow the servicer's ``_chunk_response`` / ``_complete_response``: streamed, one chunk
per step with the step's tokens (``completion_tokens`` is the step's count, smg adds them up)
and one ``GenerateComplete`` after the last; not streamed, one ``GenerateComplete`` with every
token. ``cached_tokens`` is the engine's count. vLLM's own server puts it on every chunk (vLLM's
output processor sets ``num_cached_tokens`` at the first output); the Engine Protocol reports it
with the usage of the last step, and a sidecar learns it no sooner (vLLM's streamed HTTP
completions send it in the final usage chunk only), so chunks before the last carry 0 and the
last chunk and the complete the count.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tokenkeys.engine.protocol import GenerateOutput, GenerationParams
from tokenkeys.errors import InvalidArgument
from tokenkeys.frontend.generation import eos_ids
from tokenkeys.server.grpc.generate_inputs import unsupported
from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2 as pb
from tokenkeys.serving.models import ServedModel


@dataclass(frozen=True)
class VllmGenerateInputs:
    """A validated request as the engine takes it."""

    request_id: str
    token_ids: list[int]
    params: GenerationParams
    stream: bool
    #: The request's own stop ids: stopping on one is reported as ``matched_token_id``.
    stop_ids: tuple[int, ...]
    eos_ids: tuple[int, ...]

    def matched_token(self, output_ids: list[int], finish_reason: str | None) -> int | None:
        """The stop id generation ended on, as vLLM reports it (EOS is checked first)."""
        if finish_reason != "stop" or not output_ids:
            return None
        last = output_ids[-1]
        if last in self.eos_ids or last not in self.stop_ids:
            return None
        return last


def _refuse(request: pb.GenerateRequest) -> None:
    """UNIMPLEMENTED for what the engine cannot do exactly."""
    sp = request.sampling_params
    for name, what in (
        ("mm_inputs", "multimodal inputs"),
        ("media_refs", "media references"),
        ("kv_transfer_params", "KV transfer (disaggregated prefill/decode)"),
        ("kv_transfer_params_json", "KV transfer (disaggregated prefill/decode)"),
        ("data_parallel_rank", "pinning a data-parallel rank"),
    ):
        if request.HasField(name) and not (
            name == "data_parallel_rank" and request.data_parallel_rank == 0
        ):
            raise unsupported(what, name)
    if request.extra_mm_inputs:
        raise unsupported("multimodal inputs", "extra_mm_inputs")
    if sp.n > 1:
        raise unsupported(f"n={sp.n} (several outputs per request)", "sampling_params.n")
    for name in ("logprobs", "prompt_logprobs", "truncate_prompt_tokens"):
        if sp.HasField(name):
            raise unsupported(name.replace("_", " "), f"sampling_params.{name}")
    constraint = sp.WhichOneof("constraint")
    if constraint is not None:
        raise unsupported(f"structured outputs ({constraint})", f"sampling_params.{constraint}")
    if sp.stop:
        raise unsupported("stop strings", "sampling_params.stop")
    if sp.min_tokens:
        raise unsupported("min_tokens", "sampling_params.min_tokens")
    if sp.logit_bias:
        raise unsupported("logit bias", "sampling_params.logit_bias")


def read_request(request: pb.GenerateRequest, model: ServedModel) -> VllmGenerateInputs:
    """Validate ``request`` for ``model``; see the module doc."""
    _refuse(request)
    kind = request.WhichOneof("input")
    if kind == "tokenized":
        ids = list(request.tokenized.input_ids)
        model.preprocessor.limits.check_tokens("tokenized.input_ids", len(ids))
        model.tokenizer.check_ids([ids], field="tokenized.input_ids")
    elif kind == "text":
        ids = model.preprocessor.tokenize_prompts([request.text], field_name="text")[0].ids
    else:
        raise InvalidArgument(
            "GenerateRequest has no input; set tokenized.input_ids or text", field="input"
        )
    sp = request.sampling_params
    own = tuple(sp.stop_token_ids)
    eos = () if sp.ignore_eos else eos_ids(model)
    stop = own + tuple(i for i in eos if i not in own)
    params = GenerationParams(
        max_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
        seed=sp.seed if sp.HasField("seed") else None,
        stop_token_ids=stop,
        # The distribution knobs as the servicer builds vLLM's SamplingParams from them: an
        # unset temperature is 1.0, a zero top_p or repetition penalty is 1.0 (proto3 default).
        temperature=sp.temperature if sp.HasField("temperature") else 1.0,
        top_p=sp.top_p if sp.top_p != 0.0 else 1.0,
        top_k=sp.top_k,
        min_p=sp.min_p,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty if sp.repetition_penalty != 0.0 else 1.0,
    )
    return VllmGenerateInputs(
        request_id=request.request_id or uuid.uuid4().hex,
        token_ids=ids,
        params=params,
        stream=request.stream,
        stop_ids=own,
        eos_ids=eos,
    )


def chunk(output: GenerateOutput, prompt_tokens: int) -> pb.GenerateResponse:
    """One streamed step: its tokens, the prompt's size and (once known) its cached part."""
    cached = output.usage.cached_prompt_tokens if output.usage is not None else 0
    return pb.GenerateResponse(
        chunk=pb.GenerateStreamChunk(
            token_ids=output.token_ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(output.token_ids),
            cached_tokens=cached,
            index=0,
        )
    )


def complete(
    output_ids: list[int] | tuple[int, ...],
    finish_reason: str,
    prompt_tokens: int,
    cached_tokens: int,
    matched_token_id: int | None = None,
) -> pb.GenerateResponse:
    """The request's end: ``output_ids`` (the last step's when streamed, all when not)."""
    done = pb.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=cached_tokens,
        index=0,
    )
    if matched_token_id is not None:
        done.matched_token_id = matched_token_id
    return pb.GenerateResponse(complete=done)
