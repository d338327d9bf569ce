"""Artifact path rules: the named traversal forms are refused; whatever passes stays inside."""

from __future__ import annotations

import ntpath
import os
import posixpath
from pathlib import Path, PurePosixPath, PureWindowsPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenkeys.artifacts.paths import MAX_PATH_CHARS, is_safe_path, path_problem

REFUSED = {
    "../x": "'..' segment",
    "/etc/x": "absolute",
    "a/../../b": "'..' segment",
    "a\\b": "backslash",
    "a\x00b": "NUL",
    "": "empty",
    "..": "'..' segment",
    "a/..": "'..' segment",
    "./a": "not normalized",
    "a/./b": "not normalized",
    "a//b": "not normalized",
    "a/": "not normalized",
    "C:x": "drive letter",
    "c:/windows/x": "drive letter",
    "tokenizer.json:stream": "colon",
    "\\\\server\\share\\x": "backslash",
    "a\nb": "control character",
    "x" * (MAX_PATH_CHARS + 1): "characters long",
    "a/" + "y" * 256: "over 255 bytes",
}


@pytest.mark.parametrize("path, reason", REFUSED.items(), ids=[repr(p)[:20] for p in REFUSED])
def test_named_forms_are_refused_with_the_rule(path: str, reason: str) -> None:
    problem = path_problem(path)
    assert problem is not None and reason in problem


@pytest.mark.parametrize(
    "path", ["tokenizer.json", "chat_template.jinja", "sub/dir/file.json", "a..b", ".hidden"]
)
def test_plain_relative_paths_pass(path: str) -> None:
    assert path_problem(path) is None


def test_non_strings_are_refused() -> None:
    assert "not a string" in path_problem(b"tokenizer.json")  # type: ignore[operator]


_ALPHABET = st.sampled_from(list("ab.-_/\\:\x00\n ") + ["..", "C:", "é", "日"])


@given(st.lists(_ALPHABET, max_size=12).map("".join))
def test_whatever_passes_stays_inside_the_folder_on_every_os(path: str) -> None:
    if not is_safe_path(path):
        return
    # Already normalized, relative, and without a parent step, read as POSIX or as Windows.
    assert posixpath.normpath(path) == path
    assert ntpath.normpath(path) == path.replace("/", "\\")
    assert not PurePosixPath(path).is_absolute()
    win = PureWindowsPath(path)
    assert not win.is_absolute() and not win.drive and not win.root
    assert ".." not in PurePosixPath(path).parts and ".." not in win.parts
    root = Path("/srv/tokenizer")
    assert os.path.commonpath([root, Path(posixpath.join(root, path))]) == str(root)
