"""`python -m kspec` runs the command line, as `kspec` does."""

from kspec.cli import run

run()
