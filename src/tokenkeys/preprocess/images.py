"""Images in a chat: fetched, decoded, identified and expanded into the prompt, as vLLM 0.32 does.

The chat template renders one placeholder token per image (``<image>`` for Idefics3); vLLM's
multimodal processor then replaces each, in order, by the model's expansion of that image
(:mod:`tokenkeys.preprocess.multimodal`), encoded without special tokens. The expanded run is
the item's placeholder range (``offset``, ``length``: every token of the run, not only the
image tokens, as vLLM's ``mm_placeholders`` and block keys count it). Each item's identifier is
vLLM's (:mod:`tokenkeys.keys.vllm_mm`): the client's ``uuid`` when given, else the hash of the
file's bytes, the engine's ``--model`` argument and the conversion settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenkeys.errors import FailedPrecondition, InvalidArgument
from tokenkeys.keys.context import MMItem
from tokenkeys.keys.vllm_mm import (
    DEFAULT_ALGORITHM,
    ImageConversion,
    check_release,
    image_identifier,
    uuid_identifier,
)
from tokenkeys.preprocess.media.decode import DEFAULT_MAX_PIXELS, decode_image
from tokenkeys.preprocess.media.fetch import MediaPolicy, load_url
from tokenkeys.preprocess.multimodal.processors import ImageFamily, image_family


@dataclass(frozen=True)
class ImageRef:
    """One image part of a chat, in prompt order: its URL, the client's uuid, its field."""

    url: object
    uuid: str | None
    where: str


@dataclass(frozen=True)
class MMFeature:
    """One multimodal item of a prompt: what vLLM's render reports and its block keys use."""

    modality: str
    identifier: str | None
    offset: int
    length: int

    def item(self) -> MMItem:
        """The item as the key computation takes it (needs the identifier)."""
        if self.identifier is None:
            raise FailedPrecondition(
                "the image's identifier needs the engine's model id (vLLM hashes its --model "
                "argument with each image): configure it to compute keys of image prompts",
                field="model_id",
            )
        return MMItem(self.identifier, self.offset, self.length)


#: vLLM 0.32's images per prompt when ``--limit-mm-per-prompt`` leaves the modality out
#: (``MultiModalConfig.get_limit_per_prompt``).
DEFAULT_IMAGE_LIMIT = 999


@dataclass(frozen=True)
class ImageOptions:
    """How a served model takes images: the engine's model id as hashed, limits, policy.

    ``model_id`` is the engine's ``--model`` argument as given (vLLM hashes it with each image);
    without it counts are exact and identifiers are left unset.
    """

    model_id: str | None = None
    policy: MediaPolicy = field(default_factory=MediaPolicy)
    max_pixels: int = DEFAULT_MAX_PIXELS
    limit_per_prompt: int | None = DEFAULT_IMAGE_LIMIT
    hash_algorithm: str = DEFAULT_ALGORITHM
    engine_release: str = "0.32"


class ImageExpander:
    """The images of one served model: its processor family, read once from its folder."""

    def __init__(self, folder: Path, options: ImageOptions | None = None) -> None:
        self.folder = folder
        self.options = options or ImageOptions()
        self._family: ImageFamily | None = None

    @property
    def family(self) -> ImageFamily:
        """The processor family (refused with 501 when the folder's class is not reproduced)."""
        if self._family is None:
            self._family = image_family(self.folder)
        return self._family

    def check_count(self, refs: Sequence[ImageRef]) -> None:
        """Refuse more images than the engine's ``limit_mm_per_prompt`` before any fetch."""
        limit = self.options.limit_per_prompt
        if limit is not None and len(refs) > limit:
            raise InvalidArgument(
                f"At most {limit} image(s) may be provided in one prompt, got {len(refs)}",
                field="messages",
            )

    def features(self, refs: Sequence[ImageRef]) -> list[tuple[str | None, int, int]]:
        """Per image: its identifier and its upright width and height (fetching each once)."""
        options = self.options
        check_release(options.engine_release, options.hash_algorithm)
        out = []
        for ref in refs:
            data = load_url(ref.url, options.policy, where=ref.where)
            decoded = decode_image(data, field=ref.where, max_pixels=options.max_pixels)
            ident: str | None = None
            if ref.uuid is not None:
                ident = uuid_identifier(ref.uuid, release=options.engine_release)
            elif options.model_id is not None:
                conversion = ImageConversion() if decoded.converted else None
                ident = image_identifier(
                    data,
                    options.model_id,
                    conversion,
                    algorithm=options.hash_algorithm,
                    release=options.engine_release,
                )
            out.append((ident, decoded.width, decoded.height))
        return out

    def expand(
        self,
        ids: list[int],
        refs: Sequence[ImageRef],
        encode: Callable[[str], list[int]],
        placeholder_id: int,
    ) -> tuple[list[int], list[MMFeature]]:
        """Replace each placeholder token of ``ids`` by its image's expansion, in order."""
        self.check_count(refs)
        family = self.family
        positions = [i for i, t in enumerate(ids) if t == placeholder_id]
        if len(positions) != len(refs):
            raise InvalidArgument(
                f"the prompt has {len(positions)} {family.placeholder} placeholder token(s) for "
                f"{len(refs)} image(s); remove {family.placeholder} from the text parts",
                field="messages",
            )
        found = self.features(refs)
        out: list[int] = []
        features: list[MMFeature] = []
        last = 0
        for position, (ident, width, height) in zip(positions, found, strict=True):
            out.extend(ids[last:position])
            run = encode(family.text(width, height))
            features.append(MMFeature("image", ident, len(out), len(run)))
            out.extend(run)
            last = position + 1
        out.extend(ids[last:])
        return out, features
