"""Content-addressed tokenizer fingerprints.

The fingerprint is the SHA-256 (hex) of a canonical JSON document::

    {"format": "tokenkeys.fingerprint/1",
     "files": [{"path": ..., "size": ..., "sha256": ...}, ...],   # sorted by path
     "options": {...TokenizerOptions.identity()...},
     "behaviour": "<backend behaviour string, e.g. tokenizers/1>"}

serialized with sorted keys, no insignificant whitespace and ASCII escapes. Only file contents
(through their digests), relative paths and behaviour options enter it: absolute locations,
mtimes, permissions and directory order never do, so the same bytes and options give the same
fingerprint on every host, and any change of a byte or an option gives a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from tokenkeys.tokenizer.folder import FileEntry
from tokenkeys.tokenizer.options import TokenizerOptions

FINGERPRINT_FORMAT = "tokenkeys.fingerprint/1"


def canonical_manifest(
    entries: Iterable[FileEntry], options: TokenizerOptions, behaviour: str
) -> bytes:
    """Return the exact bytes that are hashed into the fingerprint."""
    doc = {
        "format": FINGERPRINT_FORMAT,
        "files": [
            {"path": e.path, "size": e.size, "sha256": e.sha256}
            for e in sorted(entries, key=lambda e: e.path)
        ],
        "options": options.identity(),
        "behaviour": behaviour,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def fingerprint(entries: Iterable[FileEntry], options: TokenizerOptions, behaviour: str) -> str:
    """Return the fingerprint (64 lowercase hex characters) of files, options and behaviour.

    ``behaviour`` is the backend's behaviour string (``TokenizerBackend.behaviour``).
    """
    return hashlib.sha256(canonical_manifest(entries, options, behaviour)).hexdigest()
