"""`python -m specjax.cli ...`, the same as the `specjax` script."""

from specjax.cli import run

run()
