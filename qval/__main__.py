"""`python -m qval ...` is the `qval` command (for machines where the console script is not on PATH)."""

from qval.cli import main

main()
