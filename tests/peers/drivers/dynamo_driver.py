"""Dynamo's released block hashing, behind the driver protocol (runs in the Dynamo virtualenv).

Calls ``dynamo._core.compute_block_hash_for_seq`` of the installed ``ai-dynamo-runtime``
wheel (the compiled kv-router) exactly as a caller of Dynamo's Python API would.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from driver_loop import protocol_stdout, serve

answers = protocol_stdout()

from dynamo._core import compute_block_hash_for_seq  # noqa: E402 - after the stdout switch


def block_hashes(request: dict[str, Any]) -> list[list[int]]:
    """Local block hashes for each case: ``tokens``, ``block_size`` and the optional
    ``block_mm_infos``, ``lora_name`` and ``cache_namespace`` arguments."""
    return [
        compute_block_hash_for_seq(
            case["tokens"],
            case["block_size"],
            block_mm_infos=case.get("block_mm_infos"),
            lora_name=case.get("lora_name"),
            cache_namespace=case.get("cache_namespace"),
        )
        for case in request["cases"]
    ]


serve(
    {
        "version": lambda _request: version("ai-dynamo-runtime"),
        "block_hashes": block_hashes,
    },
    answers,
)
