"""The rules an artifact path must follow, applied by the server and again by the client.

An artifact path names a file inside one tokenizer folder. It is relative, '/'-separated and
already normalized, so that joining it to a folder can never reach outside that folder on any
operating system: no empty, ``.`` or ``..`` segment, no leading '/', no drive letter or other
colon (``C:x``, NTFS ``file:stream``), no backslash (a separator on Windows), no NUL or other
control character, and bounded lengths. Links are refused where files are read
(:func:`tokenkeys.tokenizer.read_folder`) and where they are written (``O_NOFOLLOW``).
"""

from __future__ import annotations

import re

# Generous bounds that every mainstream file system accepts (255 bytes per name on ext4, APFS
# and NTFS); a tokenizer file name is a few dozen characters.
MAX_PATH_CHARS = 1024
MAX_SEGMENT_BYTES = 255

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")


def path_problem(path: object) -> str | None:
    """Return which rule ``path`` breaks, in words, or None when it is a safe artifact path."""
    if not isinstance(path, str):
        return f"is a {type(path).__name__}, not a string"
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL character"
    if _CONTROL.search(path):
        return "contains a control character"
    if "\\" in path:
        return "contains a backslash (a path separator on Windows)"
    if path.startswith("/"):
        return "is absolute"
    if _DRIVE.match(path):
        return "starts with a drive letter"
    if ":" in path:
        return "contains a colon (a drive or stream separator on Windows)"
    if len(path) > MAX_PATH_CHARS:
        return f"is {len(path)} characters long (at most {MAX_PATH_CHARS})"
    for segment in path.split("/"):
        if segment == "..":
            return "has a '..' segment"
        if segment in ("", "."):
            return "is not normalized (empty or '.' segment)"
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            return f"has a segment over {MAX_SEGMENT_BYTES} bytes"
    return None


def is_safe_path(path: object) -> bool:
    """True when ``path`` follows every artifact path rule."""
    return path_problem(path) is None


RULES = (
    "artifact paths are relative, '/'-separated and normalized: no '..', '.' or empty segment, "
    "no leading '/', drive letter, colon, backslash, NUL or control character"
)
