"""smg-grpc-servicer's KV-event relay normalization, behind the driver protocol (own virtualenv).

``smg_grpc_servicer.kv_relay`` is what vLLM 0.32's ``--grpc`` server streams its events through:
``decode_batch`` reads a vLLM msgpack payload, ``Normalizer.normalize_batch`` turns it into the
``KvEventBatch`` smg indexes. One Normalizer per ``normalize`` call: one subscription's state.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from driver_loop import protocol_stdout, serve

answers = protocol_stdout()

from smg_grpc_servicer.kv_relay import Normalizer, decode_batch  # noqa: E402


def normalize(request: dict[str, Any]) -> list[str]:
    """Each ``[seq, payload hex]`` batch, normalized in order; serialized protos as hex."""
    normalizer = Normalizer()
    out = []
    for seq, payload in request["batches"]:
        batch = normalizer.normalize_batch(decode_batch(bytes.fromhex(payload)), seq)
        out.append(batch.SerializeToString().hex())
    return out


serve({"version": lambda _request: version("smg-grpc-servicer"), "normalize": normalize}, answers)
