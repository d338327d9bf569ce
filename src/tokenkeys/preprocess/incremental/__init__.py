"""Exact incremental tokenization: texts that share a prefix encode only what is new."""

from tokenkeys.preprocess.incremental.encoder import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VERIFY_EVERY,
    IncrementalEncoder,
    IncrementalOptions,
)
from tokenkeys.preprocess.incremental.history import HistoryWatch

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_VERIFY_EVERY",
    "HistoryWatch",
    "IncrementalEncoder",
    "IncrementalOptions",
]
