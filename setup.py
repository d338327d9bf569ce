"""The compiled core (``tokenkeys.keys._chains``): the only thing this file declares.

Everything else about the package is in pyproject.toml. The extension is optional: where no C
compiler is found the build warns and installs the pure-Python key paths, which compute the same
keys (``keys/native.py`` chooses at import; docs/cache-keys.md says why C and not Cython).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tokenkeys.keys._chains",
            sources=["src/tokenkeys/keys/_native/chains.c"],
            depends=["src/tokenkeys/keys/_native/sha256.h"],
            optional=True,
        )
    ]
)
