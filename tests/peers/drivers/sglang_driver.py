"""SGLang's released page hashing and KV-event recording, behind the driver protocol (runs in
the SGLang virtualenv).

Real SGLang code called here (sglang 0.5.23 wheel), for both radix-tree implementations of
0.5.23: the Rust TreeCore, which the default ``UnifiedRadixCache`` uses
(``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`` defaults to ``rust``), and the Python ``RadixCache``
path:

* ``sglang.srt.mem_cache.rust_tree_core.extension.bindings``: the bundled Rust tree
  ``RustUnifiedTreeCoreBinding`` (``insert``, ``take_events``), which hashes pages and records
  events itself, and its page hash ``get_hash_str``.
* ``sglang.srt.mem_cache.utils.get_hash_str``: the Python tree's page hash, in 0.5.23 the C++
  ``cpp_utils/hash_binding.cpp``, JIT-built with torch's extension loader on first use.
* ``sglang.srt.mem_cache.utils.hash_str_to_int64``: the event form of a page hash.
* ``sglang.srt.mem_cache.events.KVCacheEventRecorder``: ``record_store`` emits the
  ``BlockStored`` events the ZMQ publisher sends, computing each node's hashes
  (``compute_node_hash_values`` / ``compute_node_event_hash_values``, with the cache-salt seed).
* ``sglang.srt.mem_cache.utils.split_node_hash_value``: what a node split does to the hashes.
* The wire payload: ``KVEventBatch`` encoded by ``msgspec.msgpack.Encoder()``, as the scheduler's
  publisher (``scheduler_components/kv_events_publisher.py``, ``ZmqEventPublisher``) sends it.

Not importable here: ``sglang.srt.mem_cache.radix_cache`` (``RadixCache``, ``RadixKey``,
``TreeNode``) and so ``rust_tree_core.adapter`` (which imports ``RadixKey``). They import
``memory_pool`` -> ``sglang.srt.configs`` -> ``torchvision``, and PyPI's torchvision wheels link
CUDA libraries (``libc10_cuda.so``) that a CPU torch does not have. Hence two stand-ins:

* :class:`PythonTree` (:class:`Key`, :class:`Node`) for ``RadixCache``: it keeps exactly the
  attributes the recorder reads (``key.token_ids``, ``extra_key``, ``cache_salt``,
  ``is_bigram``, ``len(key)``; ``node.parent``, ``hash_value``, ``event_hash_value``) and follows
  ``RadixCache._insert_helper`` / ``_split_node`` for page-aligned keys: walk the matching
  pages, split a node where a new prompt diverges, add one node for the rest and
  ``record_store`` it.
* :meth:`RustTree.insert` turns the binding's tagged event tuples into SGLang's ``BlockStored``
  as ``rust_tree_core.adapter._kv_event_from_tagged`` does for a request without a LoRA name.
"""

from __future__ import annotations

import base64
import os
import sys
from array import array
from importlib.metadata import version
from typing import Any

from driver_loop import protocol_stdout, serve

answers = protocol_stdout()
# The JIT-built page-hash extension lives in this virtualenv, built once by its recipe.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch-extensions"))

import msgspec  # noqa: E402
import torch  # noqa: E402
from sglang.srt.disaggregation.kv_events import (  # noqa: E402
    BlockStored,
    KVEventBatch,
    StorageMedium,
    kv_event_namespace_seed,
    namespaced_block_hash,
)
from sglang.srt.mem_cache.events import KVCacheEventRecorder, KvEventLoraNames  # noqa: E402
from sglang.srt.mem_cache.rust_tree_core.extension import bindings  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.utils import (  # noqa: E402
    get_hash_str,
    hash_str_to_int64,
    split_node_hash_value,
)


class Key:
    """Stand-in for ``RadixKey`` (plain, not bigram): token ids plus the request namespace."""

    def __init__(self, token_ids: array, extra_key: str | None, cache_salt: str | None):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.cache_salt = cache_salt or None  # as RadixKey: an empty salt is no salt
        self.is_bigram = False

    def raw_token_ids(self) -> array:
        return self.token_ids

    def __len__(self) -> int:
        return len(self.token_ids)

    def sliced(self, start: int, stop: int | None = None) -> Key:
        return Key(self.token_ids[start:stop], self.extra_key, self.cache_salt)


class Node:
    """Stand-in for ``TreeNode``: the attributes ``KVCacheEventRecorder`` reads."""

    def __init__(self, key: Key, parent: Node | None):
        self.key = key
        self.parent = parent
        self.children: dict[tuple, Node] = {}
        self.hash_value: list[str] | None = None
        self.event_hash_value: list[str] | None = None


def insert(root: Node, key: Key, page_size: int, recorder: KVCacheEventRecorder) -> int:
    """Insert a page-aligned key as ``RadixCache._insert_helper`` does; returns the number of
    tokens that were already in the tree."""
    node, done = root, 0
    while done < len(key):
        child = node.children.get(_child_key(key, done, page_size))
        if child is None:
            break
        match = _matched_pages(child.key, key, done, page_size) * page_size
        if match < len(child.key):
            child = _split(child, match, page_size)
        node, done = child, done + match
    if done < len(key):
        new = Node(key.sliced(done), node)
        node.children[_child_key(key, done, page_size)] = new
        recorder.record_store(new)
    return done


def _child_key(key: Key, start: int, page_size: int) -> tuple:
    # RadixKey.child_key: the namespace and the first page.
    return (key.extra_key, key.cache_salt, tuple(key.token_ids[start : start + page_size]))


def _matched_pages(node_key: Key, key: Key, start: int, page_size: int) -> int:
    pages = 0
    limit = min(len(node_key), len(key) - start)
    while (pages + 1) * page_size <= limit:
        a = node_key.token_ids[pages * page_size : (pages + 1) * page_size]
        b = key.token_ids[start + pages * page_size : start + (pages + 1) * page_size]
        if a != b:
            break
        pages += 1
    return pages


def _split(child: Node, split_len: int, page_size: int) -> Node:
    # RadixCache._split_node: a new node takes the shared prefix and the first hash values.
    parent = child.parent
    new = Node(child.key.sliced(0, split_len), parent)
    parent.children[_child_key(child.key, 0, page_size)] = new
    child.key = child.key.sliced(split_len)
    child.parent = new
    new.children[_child_key(child.key, 0, page_size)] = child
    new.hash_value, child.hash_value = split_node_hash_value(child.hash_value, split_len, page_size)
    new.event_hash_value, child.event_hash_value = split_node_hash_value(
        child.event_hash_value, split_len, page_size
    )
    return new


class PythonTree:
    """``RadixCache`` with ``KVCacheEventRecorder`` (see the module docstring)."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.recorder = KVCacheEventRecorder(enabled=True, page_size=page_size)
        self.root = Node(Key(array("q"), None, None), None)
        self.root.hash_value = []  # as RadixCache.reset

    def insert(self, tokens: array, extra_key: str | None, cache_salt: str | None) -> list:
        insert(self.root, Key(tokens, extra_key, cache_salt), self.page_size, self.recorder)
        return self.recorder.take()


class RustTree:
    """The Rust TreeCore binding, FULL attention only, as ``RustUnifiedTreeCore`` builds it."""

    def __init__(self, page_size: int):
        self.binding = bindings.RustUnifiedTreeCoreBinding(
            bindings.TreeCoreInitParamsBinding(
                eviction_policy="lru",
                page_size=page_size,
                device="cpu",
                enable_kv_cache_events=True,
            ),
            [int(ComponentType.FULL)],
        )
        self.lora_names = KvEventLoraNames()  # no adapter registered: no LoRA namespace

    def insert(self, tokens: array, extra_key: str | None, cache_salt: str | None) -> list:
        self.binding.insert(
            bindings.InsertParamsBinding(
                key=tokens,
                value=torch.tensor(tokens, dtype=torch.int64),
                extra_key=extra_key,
                cache_salt=cache_salt,
            )
        )
        out = []
        for event in self.binding.take_events():
            if event[0] != "block_stored":
                continue
            lora_name = self.lora_names.get(event[8])
            seed = (
                kv_event_namespace_seed(extra_key=event[8], cache_salt=None)
                if lora_name is not None
                else None
            )
            out.append(
                BlockStored(
                    block_hashes=[namespaced_block_hash(h, namespace_seed=seed) for h in event[1]],
                    parent_block_hash=(
                        None
                        if event[2] is None
                        else namespaced_block_hash(event[2], namespace_seed=seed)
                    ),
                    token_ids=event[3],
                    block_size=event[4],
                    lora_id=None,
                    medium=StorageMedium(event[5]),
                    cache_salt=event[6],
                    session_id=event[7],
                    lora_name=lora_name,
                )
            )
        return out


TREES = {"python": PythonTree, "rust": RustTree}


def pages(request: dict[str, Any]) -> list[dict[str, list]]:
    """Page hashes (hex) and their event integers for each case: ``tokens`` (given to the C++
    hash as a list, ``array('I')`` or ``array('q')`` per ``typecode``, the buffers it takes),
    ``page_size`` and an optional ``prior_hex``; ``rust_hashes`` from the Rust tree's hash."""
    out = []
    for case in request["cases"]:
        tokens = case["tokens"]
        if case.get("typecode"):
            tokens = array(case["typecode"], tokens)
        prior, page_size = case.get("prior_hex"), case["page_size"]
        hashes = get_hash_str(tokens, prior, page_size=page_size)
        rust = bindings.get_hash_str(array("q", case["tokens"]), prior, page_size)
        out.append(
            {
                "hashes": hashes,
                "int64": [hash_str_to_int64(h) for h in hashes],
                "rust_hashes": rust,
            }
        )
    return out


def events(request: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """For each case, insert its ``prompts`` in order into one ``request["tree"]`` tree
    (namespace ``extra_key``, ``cache_salt``) and return, per prompt, the ``BlockStored`` events
    its insertion recorded (``stored``) and the msgpack payload SGLang publishes for them
    (``payload``, base64)."""
    encoder = msgspec.msgpack.Encoder()
    out = []
    for case in request["cases"]:
        page_size = case["page_size"]
        tree = TREES[request["tree"]](page_size)
        per_prompt = []
        for tokens in case["prompts"]:
            aligned = len(tokens) // page_size * page_size  # the tree keeps whole pages only
            recorded = tree.insert(
                array("q", tokens[:aligned]), case.get("extra_key"), case.get("cache_salt")
            )
            payload = encoder.encode(KVEventBatch(ts=0.0, events=recorded))
            stored = [
                {
                    "block_hashes": list(event.block_hashes),
                    "parent_block_hash": event.parent_block_hash,
                    "token_ids": list(event.token_ids),
                    "block_size": event.block_size,
                    "cache_salt": event.cache_salt,
                }
                for event in recorded
                if isinstance(event, BlockStored)
            ]
            per_prompt.append(
                {"stored": stored, "payload": base64.b64encode(payload).decode("ascii")}
            )
        out.append(per_prompt)
    return out


serve({"version": lambda _request: version("sglang"), "pages": pages, "events": events}, answers)
