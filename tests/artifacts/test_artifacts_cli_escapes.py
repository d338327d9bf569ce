"""``tokenkeys pull`` against a server that names its files with terminal-control characters.

The server is real (gRPC on loopback); its stream is rewritten so a file is called
``evil<U+202E RIGHT-TO-LEFT OVERRIDE>nosj.json`` (printed raw, the rest of the terminal line
is drawn right to left), so the pull fails with an error naming that file. The error line on
stderr must carry the name escaped, never the raw override (issue 16, "Terminal safety").
Control characters proper (ESC, C1) are refused by the path rules before any message.
"""

from __future__ import annotations

from pathlib import Path

from faulty_streams import consistent_manifest, served

from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path

from support import run_cli

HOSTILE = "evil\u202enosj.json"


def _rename_and_corrupt(messages: list[pb.TokenizerArtifactChunk], call: int) -> list:
    out = []
    for message in messages:
        copy = pb.TokenizerArtifactChunk()
        copy.CopyFrom(message)
        kind = copy.WhichOneof("kind")
        if kind == "manifest":
            copy.manifest.files[1].path = HOSTILE
            copy.manifest.streamed_paths[:] = [
                HOSTILE if p == message.manifest.files[1].path else p
                for p in copy.manifest.streamed_paths
            ]
            consistent_manifest(copy.manifest)
        elif getattr(copy, kind).path == message_path(messages):
            getattr(copy, kind).path = HOSTILE
        out.append(copy)
    return out


def message_path(messages: list[pb.TokenizerArtifactChunk]) -> str:
    return messages[0].manifest.files[1].path


def test_a_pull_error_prints_a_hostile_file_name_escaped(grpc_server, tmp_path: Path) -> None:  # noqa: ANN001
    tokenizer = Tokenizer.load(default_tokenizer_path())
    registry, _ = served(tokenizer, _rename_and_corrupt)
    server = grpc_server(registry)
    done = run_cli("pull", server.target, "--cache", str(tmp_path / "c"), check=False)
    assert done.returncode == 2, done.stderr
    assert "\u202e" not in done.stderr, repr(done.stderr)
    assert "evil\\u202enosj.json" in done.stderr, done.stderr
