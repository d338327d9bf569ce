"""The compiled cores: the only thing this file declares.

``tokenkeys.keys._chains`` (block-key chains) and ``tokenkeys.router.index._table`` (the
in-memory prefix index's key table). Everything else about the package is in pyproject.toml.
Both extensions are optional: where no C compiler is found the build warns and installs the
pure-Python paths, which compute the same answers (``keys/native.py`` and
``router/index/table.py`` choose at import; docs/cache-keys.md says why C and not Cython).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tokenkeys.keys._chains",
            sources=[f"src/tokenkeys/keys/_native/{name}.c" for name in ("chains", "walk", "xxh")],
            depends=[
                f"src/tokenkeys/keys/_native/{name}.h"
                for name in ("encode", "sha256", "walk", "xxh")
            ],
            optional=True,
        ),
        Extension(
            "tokenkeys.router.index._table",
            sources=[
                f"src/tokenkeys/router/index/_native/{name}.c"
                for name in ("table", "slots", "keys", "bulk")
            ],
            depends=[
                f"src/tokenkeys/router/index/_native/{name}.h" for name in ("slots", "keys", "bulk")
            ],
            optional=True,
        ),
    ]
)
