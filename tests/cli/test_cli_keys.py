"""``tokenkeys keys`` and ``tokenkeys vectors``, and the cache-key options of ``serve``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenkeys.cli import main
from tokenkeys.keys import Adapter, KeyContext, MMItem, block_keys, list_profiles, make_spec

from support import REPO, run_cli

TOKENS = [(i * 7919) % 151_000 for i in range(70)]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_json(capsys) -> None:
    code, out, _ = _run(capsys, "keys", "--list", "--json")
    listed = json.loads(out)
    assert code == 0
    assert [p["id"] for p in listed] == [p.id for p in list_profiles()]
    pickle = next(p for p in listed if p["id"] == "vllm/sha256@0.31")
    assert pickle["client_computable"] is False and "parameters" in pickle
    code, out, _ = _run(capsys, "keys", "--list")
    assert "vllm/sha256_cbor@0.31" in out and "engine-only" in out


def test_keys_json_equal_the_core(capsys, tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text(" ".join(map(str, TOKENS)) + "\n")
    args = ["keys", "--profile", "vllm/sha256_cbor@0.31", "--block-size", "16", "--root-seed"]
    args += ["42", "--lora-name", "a", "--lora-path", "/a", "--cache-salt", "s"]
    args += ["--mm", "user:img:1:3:20", "--tokens-file", str(tokens_file), "--json"]
    code, out, _ = _run(capsys, *args)
    assert code == 0
    spec = make_spec("vllm/sha256_cbor@0.31", 16, root_seed="42")
    ctx = KeyContext(
        adapter=Adapter("a", "/a"), cache_salt="s", mm_items=(MMItem("user:img:1", 3, 20),)
    )
    want = block_keys(TOKENS, spec, ctx)
    assert json.loads(out) == {
        "keys": [k.hex for k in want],
        "event_keys": [k.event_key for k in want],
    }


def test_keys_read_the_output_of_tokenize_json_and_of_http_tokenize(capsys, tmp_path) -> None:
    text = "Routers and engines agree on every token id, and on every cache key, of this prompt."
    code, out, _ = _run(capsys, "tokenize", text, "--json")
    assert code == 0
    ids = json.loads(out)[0]["ids"]
    keys = ["keys", "--profile", "vllm/sha256_cbor@0.31", "--block-size", "16", "--json"]
    want = [k.hex for k in block_keys(ids, make_spec("vllm/sha256_cbor@0.31", 16))]
    assert want  # at least one full block
    for name, content in (
        ("tokenize.json", out),
        ("http.json", json.dumps({"count": len(ids), "tokens": ids})),
    ):
        path = tmp_path / name
        path.write_text(content)
        code, answer, _ = _run(capsys, *keys, "--tokens-file", str(path))
        assert code == 0 and json.loads(answer)["keys"] == want, name
    two = tmp_path / "two.json"
    two.write_text(json.dumps([{"ids": ids}, {"ids": ids}]))
    code, _, err = _run(capsys, *keys, "--tokens-file", str(two))
    assert code != 0 and "holds 2 tokenized prompts" in err


def test_keys_of_groups_parents_embeds_and_llmd(capsys) -> None:
    spec = make_spec("vllm/sha256_cbor@0.31", None, groups=[16, 32])
    tokens = ",".join(map(str, TOKENS))
    code, out, _ = _run(
        capsys,
        "keys",
        "--profile",
        spec.profile_id,
        "--kv-groups",
        "16,32",
        "--group",
        "1",
        "--tokens",
        tokens,
        "--json",
    )
    assert json.loads(out)["keys"] == [k.hex for k in block_keys(TOKENS, spec, KeyContext(group=1))]
    parent = block_keys(TOKENS, spec)[0].digest
    digests = [hashlib.sha256(bytes([i])).digest() for i in range(3)]
    first48 = ",".join(map(str, TOKENS[:48]))
    code, out, _ = _run(
        capsys,
        "keys",
        "--profile",
        spec.profile_id,
        "--tokens",
        first48,
        "--parent",
        parent.hex(),
        *[a for d in digests for a in ("--prompt-embeds-digest", d.hex())],
        "--block-size",
        "16",
        "--json",
    )
    ctx = KeyContext(parent=parent, prompt_embeds_digests=tuple(digests))
    want = block_keys(TOKENS[:48], make_spec(spec.profile_id, 16), ctx)
    assert json.loads(out)["keys"] == [k.hex for k in want]
    code, out, _ = _run(
        capsys,
        "keys",
        "--profile",
        "llmd/cbor-fnv64@0.10",
        "--model-name",
        "m",
        "--tokens",
        tokens,
        "--json",
    )
    llmd = block_keys(TOKENS, make_spec("llmd/cbor-fnv64@0.10", 16), KeyContext(model="m"))
    assert json.loads(out)["event_keys"] == [k.event_key for k in llmd]
    # Plain output: one "hex event" line per key; SGLang's events are signed.
    code, out, _ = _run(capsys, "keys", "--profile", "sglang/sha256@0.5.23", "--tokens", tokens)
    lines = out.splitlines()
    assert len(lines) == 4 and all(len(line.split()[0]) == 64 for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "1,2,3"], "give --profile ID"),
        (["--profile", "nope@1", "--tokens", "1"], "unknown cache-key profile 'nope@1'"),
        (["--profile", "vllm/sha256_cbor@0.31"], "give --tokens"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1,x"], "integers separated"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1,-2"], "token 1 is -2"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1", "--mm", "img:3"], "IDENTIFIER"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1", "--lora-path", "/a"], "needs"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1", "--lora-name", "a"], "path"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1", "--cache-salt", "a@b"], "'@'"),
        (["--profile", "vllm/sha256_cbor@0.31", "--tokens", "1", "--parent", "xyz"], "not hex"),
        (["--profile", "sglang/sha256@0.5.23", "--tokens", "1", "--lora-name", "a"], "LoRA"),
        (["--profile", "none", "--tokens", "1"], "computes no keys"),
        (["--block-size", "32", "--tokens", "1", "--remote", "x:1"], "--block-size describe"),
    ],
)
def test_bad_keys_arguments_exit_2_with_a_message(capsys, args, message) -> None:
    code, _, err = _run(capsys, "keys", *args)
    assert code == 2
    assert message in err and err.startswith("tokenkeys keys: error:")


def test_tokens_file_errors(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    code, _, err = _run(
        capsys, "keys", "--profile", "vllm/sha256_cbor@0.31", "--tokens-file", str(missing)
    )
    assert code == 2 and "missing.json" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"other": [1]}')
    code, _, err = _run(
        capsys, "keys", "--profile", "vllm/sha256_cbor@0.31", "--tokens-file", str(bad)
    )
    assert code == 2 and "JSON list of integers" in err


def test_vectors_write_and_check(capsys, tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "vectors", "--out", str(tmp_path))
    assert code == 0
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == sorted(p.name for p in (REPO / "testvectors").glob("*.json"))
    for name in written:
        assert (tmp_path / name).read_text() == (REPO / "testvectors" / name).read_text()
    assert _run(capsys, "vectors", "--check", "--out", str(REPO / "testvectors"))[0] == 0
    (tmp_path / written[0]).write_text("{}\n")
    code, _, err = _run(capsys, "vectors", "--check", "--out", str(tmp_path))
    assert code == 1 and f"stale: {tmp_path / written[0]}" in err


def test_serve_refuses_bad_cache_key_options_before_binding() -> None:
    for args, message in (
        (["--cache-key-profile", "vllm/sha256@0.99"], "unknown cache-key profile"),
        (["--root-seed", "1", "--cache-key-profile", "dynamo/xxh3@1.6"], "has no root"),
        (["--kv-groups", "full_attention:16,sliding_window:x"], "kv-groups entry 1"),
    ):
        result = run_cli("serve", "--grpc-port", "1", *args, check=False)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "gRPC listening" not in result.stdout


def test_list_into_a_closed_pipe_stops_quietly() -> None:
    # `tokenkeys keys --list --json | head` once ended in a BrokenPipeError traceback. A real
    # pipe whose reader is already gone makes the first write fail every time.
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tokenkeys.cli", "keys", "--list", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141  # as a shell reports a program ended by SIGPIPE
