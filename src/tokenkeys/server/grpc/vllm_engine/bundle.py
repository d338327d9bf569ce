"""``GetTokenizer``: the served tokenizer's files as the zip smg unpacks, SHA-256 on the last chunk.

smg 1.13 (``crates/grpc_client/src/tokenizer_bundle.rs``) concatenates the chunks' ``data``,
requires a non-empty ``sha256`` on the last chunk and compares it (case-insensitively) with the
SHA-256 of the bytes, refuses more than 50 entries, 500 MiB unpacked or any ``..``/absolute path,
then loads the unpacked folder as a tokenizer. smg-grpc-servicer 0.14.1 (``tokenizer_bundle.py``,
what vLLM 0.32's ``--grpc`` serves) deflates the folder's tokenizer files into 64 KiB chunks.

The files here are the bytes the served tokenizer was loaded and fingerprinted from (the
:class:`~tokenkeys.tokenizer.folder.TokenizerFolder` contents), not a second read of the folder.
Unlike the servicer's archive, this one is reproducible: entries in sorted path order with a
fixed timestamp and mode, so the same tokenizer gives the same ``sha256`` on every host (the
servicer's zip carries each file's mtime, so its digest is a transfer checksum only).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

from tokenkeys.server.grpc.vllm_engine.stubs import common_pb2
from tokenkeys.tokenizer.folder import TokenizerFolder

#: Bytes per chunk, as smg-grpc-servicer streams them.
CHUNK_SIZE = 64 * 1024
#: The entry limit of smg's unpacker (``MAX_ZIP_ENTRIES``).
MAX_ENTRIES = 50
# The earliest time a zip entry can carry: no host's clock leaks into the archive.
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class TokenizerBundle:
    """The archive and the hex SHA-256 of its bytes."""

    data: bytes
    sha256: str

    def chunks(self) -> Iterator[common_pb2.GetTokenizerChunk]:
        """The archive in order, ``CHUNK_SIZE`` bytes a chunk; ``sha256`` on the last only."""
        total = len(self.data)
        for start in range(0, total, CHUNK_SIZE):
            end = min(start + CHUNK_SIZE, total)
            yield common_pb2.GetTokenizerChunk(
                data=self.data[start:end], sha256=self.sha256 if end == total else ""
            )


def build_bundle(folder: TokenizerFolder) -> TokenizerBundle:
    """Zip every file of ``folder`` (relative paths, sorted, deflated) into a bundle."""
    paths = sorted(folder.contents)
    if len(paths) > MAX_ENTRIES:  # a tokenizer folder holds a handful; smg would refuse it
        raise ValueError(f"{len(paths)} tokenizer files; smg unpacks at most {MAX_ENTRIES}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            info = zipfile.ZipInfo(path, date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, folder.contents[path])
    data = buffer.getvalue()
    return TokenizerBundle(data, hashlib.sha256(data).hexdigest())
