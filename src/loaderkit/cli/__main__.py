"""``python -m loaderkit.cli``: the same as ``python -m loaderkit`` (``loaderkit.cli.main``)."""

import sys

from loaderkit.cli import main

sys.exit(main())
