"""``python -m loaderkit``: see :mod:`loaderkit.cli`."""

import sys

from loaderkit.cli import main

sys.exit(main())
