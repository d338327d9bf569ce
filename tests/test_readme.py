"""The README's tour and Python example run as written against real servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from doc_blocks import checkout_env, parse_json_stream, run_shell, shell_block, swap_ports
from ports import free_port

from tokenkeys.keys.deployment import KeySpecOptions, build_spec
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import attach_cache_keys
from tokenkeys.tokenizer import TokenizerOptions

from support import REPO, ServerThread


def readme_python() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README holds one Python example"
    return blocks[0]


def test_readme_python_example(tmp_path: Path, capsys) -> None:
    limits = Limits()
    models = load_models([ModelSource.default()], TokenizerOptions(), limits)
    attach_cache_keys(models, build_spec(KeySpecOptions()), limits)
    with ServerThread(models) as server:
        # The example is self-contained; only its two addresses become this test's.
        source = readme_python()
        for line in ('TARGET = "127.0.0.1:50052"', 'CACHE = "/tmp/tokenkeys-artifacts"'):
            assert line in source, line
        source = source.replace('"127.0.0.1:50052"', repr(server.target))
        source = source.replace('"/tmp/tokenkeys-artifacts"', repr(str(tmp_path / "cache")))
        exec(compile(source, "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("local ")
    count, digest, event_key = out[1].split()
    assert int(count) > 0 and len(digest) == 64
    assert int(event_key) == int.from_bytes(bytes.fromhex(digest)[-8:], "big")


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    # ``tokenkeys`` is this checkout's; HOME is the test's (pull and route keep their cache
    # there); the tour's three ports become free ones, nothing else changes.
    env = {**checkout_env(tmp_path), "HOME": str(tmp_path)}
    grpc_port, http_port, router_port = free_port(), free_port(), free_port()
    tour = swap_ports(
        shell_block("README.md", "tests/test_readme.py::test_the_tour_runs_as_written"),
        {50052: grpc_port, 8001: http_port, 9000: router_port},
    )
    listens = {"tokenkeys serve": [grpc_port, http_port], "tokenkeys route": [router_port]}
    with run_shell(tour, cwd=tmp_path, env=env, listens=listens) as ran:
        printed = ran.stdout.splitlines(keepends=True)
    # pull prints the folder it installed into, between the JSON the other commands print.
    (at,) = [i for i, line in enumerate(printed) if line.startswith(str(tmp_path))]
    remote, chat, profiles, keys = parse_json_stream("".join(printed[:at]))
    routed, completion = parse_json_stream("".join(printed[at + 1 :]))
    assert (tmp_path / printed[at].strip() / "tokenizer.json").is_file()
    # The engine over gRPC and the router over HTTP give "Hello world" the same ids.
    assert remote == [{"ids": routed["tokens"], "count": routed["count"]}] and routed["count"]
    # Through the router's front door the worker generates for the prompt /tokenize counts.
    assert completion["usage"]["prompt_tokens"] == routed["count"]
    assert completion["choices"][0]["finish_reason"] == "length"
    assert chat["count"] == len(chat["tokens"]) > 0
    assert "vllm/sha256_cbor@0.31" in {profile["id"] for profile in profiles}
    (prompt,) = json.loads((tmp_path / "ids.json").read_text())
    assert len(keys["keys"]) == len(keys["event_keys"]) == prompt["count"] // 16 > 0


def test_readme_map_names_every_room_and_only_what_exists() -> None:
    # A room is a package of src/tokenkeys; its row names its sub-packages, and every folder
    # or module a row names is there (the map is checked against the tree, not trusted).
    src = REPO / "src" / "tokenkeys"
    text = (REPO / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `src/tokenkeys/([a-z_/]+)/` \| (.*) \|$", text, re.M))
    rooms = sorted(
        p.name
        for p in src.iterdir()
        if (p / "__init__.py").exists() and not p.name.startswith("_gen")
    )
    assert sorted(rows) == rooms, "README's map lags the rooms of src/tokenkeys"
    for room, what in rows.items():
        folder = src / room
        subs = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").exists())
        assert [s for s in subs if f"`{s}/`" not in what] == [], f"{room}/ row misses sub-rooms"
        named = re.findall(r"`([a-z_]+/|[a-z_]+\.py)`", what)
        assert [n for n in named if not (folder / n.rstrip("/")).exists()] == [], room
