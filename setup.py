"""The compiled cores: the only thing this file declares.

``tokenkeys.keys._chains`` (block-key chains), ``tokenkeys.router.index._table`` (the
in-memory prefix index's key table) and ``tokenkeys.router.policy._rank`` (the precise policy's
scores, costs and order). Everything else about the package is in pyproject.toml. The
extensions are optional: where no C compiler is found the build warns and installs the
pure-Python paths, which compute the same answers (``keys/native.py``,
``router/index/table.py`` and ``router/policy/ranking.py`` choose at import; docs/cache-keys.md
says why C and not Cython).
"""

import sys

from setuptools import Extension, setup

KEYS_NATIVE = "src/tokenkeys/keys/_native"
# The ranking's costs must be bit-identical to Python's: no a * b + c fused into one rounding
# (GCC contracts by default where the target has FMA, e.g. aarch64).
NO_CONTRACTION = [] if sys.platform == "win32" else ["-ffp-contract=off"]

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
                for name in ("table", "slots", "keys", "bulk", "counts")
            ],
            depends=[
                f"src/tokenkeys/router/index/_native/{name}.h"
                for name in ("slots", "keys", "bulk", "counts")
            ],
            optional=True,
        ),
        Extension(
            "tokenkeys.router.policy._rank",
            # XXH64 for the rendezvous hash, found as the key core finds it (xxh.c).
            sources=["src/tokenkeys/router/policy/_native/rank.c", f"{KEYS_NATIVE}/xxh.c"],
            depends=[f"{KEYS_NATIVE}/{name}.h" for name in ("xxh", "encode")],
            include_dirs=[KEYS_NATIVE],
            extra_compile_args=NO_CONTRACTION,
            optional=True,
        ),
    ]
)
