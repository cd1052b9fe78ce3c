"""`python -m specjax.cli ...`, the same as the `specjax` script."""

import sys

from specjax.cli import main

sys.exit(main())
