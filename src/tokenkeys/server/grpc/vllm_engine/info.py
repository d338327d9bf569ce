"""``GetModelInfo``, ``GetServerInfo`` and ``GetLoads`` answers for one served model.

Field by field as smg-grpc-servicer 0.14.1 fills them for vLLM 0.32 (``vllm/model_info.py``
``model_facts`` / ``server_facts``, ``vllm/loads.py`` ``scheduler_load_fields``), from what a
tokenkeys server knows: the served tokenizer (vocabulary, special tokens, generation
defaults), the engine (context length, KV blocks and their size, load). What it does not know
(the model's architecture and dtype, the attention backend, a scheduler window) is left empty,
the proto's "unknown", never made up.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from tokenkeys import __version__
from tokenkeys.engine.protocol import EngineLoad
from tokenkeys.frontend.generation import eos_ids
from tokenkeys.server.grpc.vllm_engine.load_estimate import LoadEstimate
from tokenkeys.server.grpc.vllm_engine.stubs import vllm_engine_pb2 as pb
from tokenkeys.serving.models import ServedModel

#: The generation-config defaults the servicer advertises (``SAMPLING_DEFAULT_KEYS``).
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _sampling_defaults(model: ServedModel) -> str:
    """generation_config.json's sampling defaults as compact JSON; empty when it sets none."""
    config = model.tokenizer.folder.json("generation_config.json")
    chosen = {k: config[k] for k in SAMPLING_DEFAULT_KEYS if config.get(k) is not None}
    return json.dumps(chosen, separators=(",", ":")) if chosen else ""


def model_info(model: ServedModel, max_model_len: int | None) -> pb.GetModelInfoResponse:
    """The model as the worker serves it; paths are the served tokenizer folder's."""
    specials = model.tokenizer.specials
    folder = str(model.tokenizer.folder.root)
    context = max_model_len or 0
    return pb.GetModelInfoResponse(
        model_path=folder,
        is_generation=model.engine is not None,
        max_context_length=context,
        vocab_size=model.tokenizer.vocab_size,
        supports_vision=False,
        served_model_name=model.name,
        tokenizer_path=folder,
        eos_token_ids=list(eos_ids(model)),
        pad_token_id=specials.pad.id if specials.pad is not None else 0,
        bos_token_id=specials.bos.id if specials.bos is not None else 0,
        max_req_input_len=context,
        default_sampling_params_json=_sampling_defaults(model),
    )


def server_info(block_size: int) -> pb.GetServerInfoResponse:
    """The worker's facts smg labels it with: one data-parallel rank, its KV block size.

    As vLLM 0.32's servicer answers (``server_facts``), the request counters and clocks the
    message also has (``active_requests``, ``last_receive_timestamp``, ``uptime_seconds``)
    are left 0; what names vLLM's own configuration (dtypes, ``max_num_seqs``, the attention
    backend, the ``/dev/shm`` identity for media tensors, where constrained decoding starts)
    is unknown to a tokenkeys engine, which serves neither media nor structured output.
    """
    return pb.GetServerInfoResponse(data_parallel_size=1, block_size=block_size)


def loads(load: EngineLoad, block_size: int, estimate: LoadEstimate) -> pb.GetLoadsResponse:
    """The engine's load as one data-parallel rank's ``SchedulerLoad``, with the face's
    estimate of queued work, throughput and hit rate (load_estimate)."""
    usage = load.used_kv_blocks / load.total_kv_blocks if load.total_kv_blocks else 0.0
    entry = pb.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=load.running,
        num_waiting_reqs=load.waiting,
        num_total_reqs=load.running + load.waiting,
        token_usage=usage,
        utilization=usage,
        **estimate.fields(load.waiting),
    )
    if load.total_kv_blocks and block_size:
        entry.max_total_num_tokens = load.total_kv_blocks * block_size
        entry.num_used_tokens = load.used_kv_blocks * block_size
    return pb.GetLoadsResponse(
        timestamp=datetime.now(timezone.utc).isoformat(),
        version=f"tokenkeys-{__version__}",
        dp_rank_count=1,
        loads=[entry],
    )
