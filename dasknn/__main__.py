"""Allow ``python -m dasknn``."""

import sys

from dasknn.cli import main

sys.exit(main())
