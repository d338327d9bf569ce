"""The compiled key core (``tokenkeys.keys._chains``), when it was built, and the switch to it.

The C extension computes the block-key chains of the client-computable profiles in one pass
over the token buffer (serialization and digest, no Python per block). It is optional: a
platform without a compiler installs without it, and each profile then runs its pure-Python
fast path, which computes the same keys (the tests run every vector, property and conformance
check through both). ``TOKENKEYS_NATIVE=0`` in the environment keeps the pure-Python paths even
where the extension is built (read once, at import).

The xxhash-based chains need libxxhash's entry points, which the extension finds in the xxhash
package's own module at import; where it cannot (``XXHASH`` false), those profiles stay in
Python while the SHA-256 and FNV chains still run in C.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: Environment variable that, set to ``0``, keeps every profile on its pure-Python path.
ENV = "TOKENKEYS_NATIVE"


def load_core(name: str) -> ModuleType | None:
    """The compiled module ``name`` (its full name), or ``None`` where it is not built or
    ``TOKENKEYS_NATIVE=0`` switches the compiled cores off (every core of the package reads
    the one switch)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        # By its full name: ``from tokenkeys.keys import _chains`` reads as an import of the
        # package (keys/__init__), which imports the profiles, which import this module.
        return importlib.import_module(name)
    except ImportError:
        return None


#: The extension module, or ``None`` (not built, or switched off). Tests replace it to run the
#: pure-Python paths in the same process.
CORE: ModuleType | None = load_core("tokenkeys.keys._chains")


def chains(*, xxhash: bool = False) -> ModuleType | None:
    """The compiled module if it can compute a chain (``xxhash``: one that needs XXH3/XXH64)."""
    core = CORE
    if core is None or (xxhash and not core.XXHASH):
        return None
    return core


def describe() -> str:
    """One line for logs and benchmarks: which key core runs."""
    core = CORE
    if core is None:
        return "pure Python" + (f" ({ENV}=0)" if os.environ.get(ENV) == "0" else "")
    return f"C (SHA-256 {core.SHA256}; xxhash chains {'in C' if core.XXHASH else 'in Python'})"
