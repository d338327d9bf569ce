"""The named ways an artifact transfer can break a rule, and the error that reports one.

Every refused transfer raises :class:`~tokenkeys.errors.ArtifactError` (gRPC ``DATA_LOSS``) whose
``field`` is the file at fault (``manifest`` for the manifest as a whole) and whose
``details["fault"]`` is one of the names below, so callers and tests can tell faults apart
without parsing messages.
"""

from __future__ import annotations

from tokenkeys.errors import ArtifactError

FAULTS: dict[str, str] = {
    "no-manifest": "the stream did not start with a manifest",
    "bad-manifest": "a manifest field is malformed (digest, fingerprint, size, order, format)",
    "unsafe-path": "a path breaks the artifact path rules (traversal, absolute, backslash, NUL)",
    "unknown-file": "a path is not one of the tokenizer files this client knows",
    "fingerprint-mismatch": "the fingerprint does not follow from the files and identity, or "
    "is not the one asked for",
    "unexpected-file": "data or a file end for a file other than the one due next",
    "offset-gap": "a chunk starts after the bytes received so far (missing or reordered chunk)",
    "offset-overlap": "a chunk starts before the end of the bytes received so far",
    "oversized-chunk": "a chunk is empty or larger than the manifest's chunk size",
    "size-mismatch": "a file's bytes or file end disagree with its size in the manifest",
    "digest-mismatch": "a file end's digest disagrees with the manifest",
    "corrupt": "the received bytes do not hash to the manifest's digest",
    "truncated": "the stream ended before every file was complete",
    "trailing-data": "the stream went on after its last file",
    "resume-mismatch": "a resumed stream does not continue the interrupted one",
    "cache-corrupt": "a cache entry's files do not hash to its fingerprint",
}


def fault(path: str, name: str, message: str) -> ArtifactError:
    """The error for fault ``name`` in file ``path``: ``"<path>: <message>"``."""
    assert name in FAULTS, name
    return ArtifactError(f"{path}: {message}", field=path, fault=name)
