"""`python -m studies ...` is the `workbench` command."""

from .cli import entry

entry()
