"""Tokenizer core: loading a folder, encode/decode, special tokens, fingerprint."""

from tokenkeys.tokenizer.backends import Encoded, Truncation
from tokenkeys.tokenizer.embedded import DEFAULT_MODEL_NAME, default_tokenizer_path
from tokenkeys.tokenizer.fingerprint import fingerprint
from tokenkeys.tokenizer.folder import TOKENIZER_FILES, FileEntry, TokenizerFolder, read_folder
from tokenkeys.tokenizer.options import TokenizerOptions
from tokenkeys.tokenizer.specials import Specials
from tokenkeys.tokenizer.tokenizer import TOKEN_STRS, Tokenizer, TokenStrs

__all__ = [
    "DEFAULT_MODEL_NAME",
    "TOKENIZER_FILES",
    "TOKEN_STRS",
    "Encoded",
    "FileEntry",
    "Specials",
    "Tokenizer",
    "TokenizerFolder",
    "TokenStrs",
    "TokenizerOptions",
    "Truncation",
    "default_tokenizer_path",
    "fingerprint",
    "read_folder",
]
