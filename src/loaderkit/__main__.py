"""``python -m loaderkit``: see ``loaderkit.cli``."""

import sys

from loaderkit.cli import main

sys.exit(main())
