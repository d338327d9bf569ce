"""A tokenizer folder on disk: which files belong to it, their digests, and their parsed configs.

Only the files that change tokenization or templating are part of a tokenizer's identity. Anything
else in the folder (a README, a NOTICE, model weights) is ignored, so it can neither change the
fingerprint nor be streamed as an artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenkeys.errors import TokenizerLoadError

# The files a Hugging Face tokenizer folder may hold that influence tokenization or templating,
# in the order transformers consults them. Paths are relative to the folder.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    # A multimodal model's processor settings: the placeholder expansion reads them (issue 35).
    "processor_config.json",
    "preprocessor_config.json",
)

REQUIRED_FILES: tuple[str, ...] = ("tokenizer.json",)

# Named chat templates beside the default one (transformers 4.51+: one .jinja file per name).
TEMPLATE_DIR = "additional_chat_templates"


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a tokenizer: its relative path, size in bytes and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class TokenizerFolder:
    """The identity-bearing files of a tokenizer folder, read once and frozen.

    ``contents`` holds the bytes that were digested, so that what is loaded is exactly what was
    fingerprinted (no second read that could see a file changed in between).
    """

    root: Path
    entries: tuple[FileEntry, ...]
    contents: dict[str, bytes]

    def json(self, name: str) -> dict[str, Any]:
        """Parse one JSON file of the folder; an absent file is an empty dict."""
        raw = self.contents.get(name)
        if raw is None:
            return {}
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerLoadError(
                f"{self.root / name}: not valid UTF-8 JSON ({exc}); fix or remove the file",
                field=name,
            ) from exc
        if not isinstance(value, dict):
            raise TokenizerLoadError(
                f"{self.root / name}: expected a JSON object, got {type(value).__name__}",
                field=name,
            )
        return value

    def text(self, name: str) -> str | None:
        """Return one text file of the folder decoded as UTF-8, or None when absent."""
        raw = self.contents.get(name)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenizerLoadError(
                f"{self.root / name}: not valid UTF-8 ({exc})", field=name
            ) from exc


def read_folder(root: str | os.PathLike[str]) -> TokenizerFolder:
    """Read the tokenizer files of ``root``, refusing links, missing required files and non-files.

    Raises :class:`TokenizerLoadError` naming the path and the cause.
    """
    folder = Path(root)
    if not folder.is_dir():
        raise TokenizerLoadError(
            f"{folder}: not a directory; --model takes a local tokenizer folder "
            f"(holding {', '.join(TOKENIZER_FILES[:2])}, ...)",
            field="model",
        )
    entries: list[FileEntry] = []
    contents: dict[str, bytes] = {}
    extra = sorted(p.name for p in (folder / TEMPLATE_DIR).glob("*.jinja"))
    for name in (*TOKENIZER_FILES, *(f"{TEMPLATE_DIR}/{n}" for n in extra)):
        path = folder / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            if name in REQUIRED_FILES:
                raise TokenizerLoadError(
                    f"{path}: missing; a tokenizer folder needs {name}", field=name
                ) from None
            continue
        # A link could make the served bytes differ from what an operator inspected, and could
        # point outside the folder when streamed as an artifact: refuse it outright.
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise TokenizerLoadError(
                f"{path}: not a regular file (links and special files are refused); "
                "copy the file into the folder",
                field=name,
            )
        data = path.read_bytes()
        entries.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))
        contents[name] = data
    return TokenizerFolder(folder, tuple(sorted(entries, key=lambda e: e.path)), contents)
