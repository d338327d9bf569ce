"""A restricted reader of one dense tensor saved by ``torch.save`` (no torch needed).

vLLM's completions ``prompt_embeds`` is base64 of ``torch.save(tensor)``
(``vllm/renderers/embed_utils.py`` ``safe_load_prompt_embeds``, vLLM 0.32). Since torch 1.6 that
file is a zip archive: ``<name>/data.pkl`` (a pickle of protocol 2 calling
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)``, the
storage a persistent id ``("storage", torch.<Dtype>Storage, key, location, numel)``),
``<name>/data/<key>`` (the storage's raw elements) and ``<name>/byteorder``. Read from torch 2.13's
output (``torch/serialization.py`` ``_save``, ``_load``); the unit tests hold files torch wrote.

Only what can be read exactly is read: one tensor of a floating dtype in :data:`DTYPES`, stored
little-endian, laid out row-major and contiguous (any storage offset). Everything else (the
legacy non-zip format, other globals in the pickle, sparse or quantized tensors, strided views,
big-endian storage) is refused with :class:`InvalidArgument` naming ``prompt_embeds``; the
unpickler resolves no name outside the three it needs, so nothing in the payload runs.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from math import prod
from typing import Any

from tokenkeys.errors import InvalidArgument

FIELD = "prompt_embeds"

#: torch storage class -> (dtype name as torch prints it without ``torch.``, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "FloatStorage": ("float32", 4),
    "BFloat16Storage": ("bfloat16", 2),
    "HalfStorage": ("float16", 2),
}


@dataclass(frozen=True)
class Tensor:
    """A dense tensor: its dtype (``float32``, ``bfloat16``, ``float16``), shape and the
    row-major little-endian bytes of its elements (what torch's ``tensor_data`` views)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def itemsize(self) -> int:
        return next(size for name, size in DTYPES.values() if name == self.dtype)


@dataclass(frozen=True)
class _StorageRef:
    dtype: str
    itemsize: int
    key: str
    numel: int


def _refuse(why: str) -> InvalidArgument:
    return InvalidArgument(f"prompt_embeds {why}", field=FIELD)


class _Unpickler(pickle.Unpickler):
    """Resolves only the rebuild function, the storage classes and OrderedDict."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in DTYPES:
            return DTYPES[name]
        if module == "torch" and name.endswith("Storage"):
            raise _refuse(
                f"has storage {name}; tokenkeys reads {', '.join(sorted(DTYPES))} tensors only"
            )
        raise _refuse(
            f"is not one dense tensor saved by torch.save: its pickle names {module}.{name}"
        )

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _refuse(f"has a storage reference tokenkeys does not read: {pid!r:.80}")
        _, kind, key, _location, numel = pid
        if not (isinstance(kind, tuple) and isinstance(key, str) and isinstance(numel, int)):
            raise _refuse(f"has a storage reference tokenkeys does not read: {pid!r:.80}")
        return _StorageRef(kind[0], kind[1], key, numel)


def _rebuild(
    storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any
) -> tuple[_StorageRef, int, tuple[int, ...], tuple[int, ...]]:
    if not isinstance(storage, _StorageRef):
        raise _refuse("is not a tensor of a plain storage")
    return storage, int(offset), tuple(size), tuple(stride)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def load_tensor(payload: bytes) -> Tensor:
    """The tensor of a ``torch.save`` file, or InvalidArgument naming what cannot be read."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
    except zipfile.BadZipFile:
        raise _refuse(
            "is not a zip-format torch.save file (torch's legacy format is not read)"
        ) from None
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise _refuse("is not a torch.save archive: no single <name>/data.pkl")
        root = pickles[0].removesuffix("data.pkl")
        order = root + "byteorder"
        if order in names and archive.read(order).strip() != b"little":
            raise _refuse("is stored big-endian; tokenkeys reads little-endian storage only")
        try:
            rebuilt = _Unpickler(io.BytesIO(archive.read(pickles[0]))).load()
        except InvalidArgument:
            raise
        except Exception as exc:  # a malformed pickle: name what failed, never run anything
            raise _refuse(f"has an unreadable pickle: {type(exc).__name__}: {exc}") from None
        if not (isinstance(rebuilt, tuple) and len(rebuilt) == 4):
            raise _refuse("is not one tensor (a container or other object was saved)")
        ref, offset, shape, stride = rebuilt
        if stride != _contiguous_strides(shape) and prod(shape) > 1:
            raise _refuse(
                f"is a strided view (size {shape}, stride {stride}); save a contiguous tensor "
                "(tensor.contiguous())"
            )
        try:
            raw = archive.read(f"{root}data/{ref.key}")
        except KeyError:
            raise _refuse(f"names storage {ref.key!r} the archive does not hold") from None
    count = prod(shape)
    if len(raw) != ref.numel * ref.itemsize or offset < 0 or offset + count > ref.numel:
        raise _refuse(
            f"storage holds {len(raw)} bytes, not {ref.numel} {ref.dtype} elements covering "
            f"offset {offset} and size {shape}"
        )
    start = offset * ref.itemsize
    return Tensor(ref.dtype, shape, raw[start : start + count * ref.itemsize])


_STORAGE_OF = {name: storage for storage, (name, _) in DTYPES.items()}


def _int(value: int) -> bytes:
    return b"J" + value.to_bytes(4, "little", signed=True)  # BININT


def _text(value: str) -> bytes:
    data = value.encode()
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def _ints(values: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"  # MARK ... TUPLE


def save_tensor(tensor: Tensor) -> bytes:
    """``tensor`` as ``torch.save`` writes a contiguous one (what :func:`load_tensor` reads and
    ``torch.load(weights_only=True)`` accepts): the sidecar's prompt-embeds probe."""
    numel = prod(tensor.shape)
    if len(tensor.data) != numel * tensor.itemsize:
        raise ValueError(f"{len(tensor.data)} bytes are not {numel} {tensor.dtype} elements")
    storage = _STORAGE_OF[tensor.dtype]
    pickled = b"".join(
        (
            b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(",
            b"(" + _text("storage") + f"ctorch\n{storage}\n".encode() + _text("0"),
            _text("cpu") + _int(numel) + b"tQ",  # the storage as a persistent id
            _int(0) + _ints(tensor.shape) + _ints(_contiguous_strides(tensor.shape)),
            b"\x89ccollections\nOrderedDict\n)RtR.",  # requires_grad False, no hooks
        )
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/data/0", tensor.data)
        archive.writestr("archive/version", "3\n")
    return out.getvalue()
