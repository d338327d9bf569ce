"""``python -m tokenkeys.cli``: the same as the ``tokenkeys`` console script."""

import sys

from tokenkeys.cli import main

sys.exit(main())
