"""`python -m specjax ...`: see specjax.cli."""

import sys

from specjax.cli.main import main

sys.exit(main())
