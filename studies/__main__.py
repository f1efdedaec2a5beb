"""`python -m studies ...` is the `workbench` command."""

from ._run.cli import entry

entry()
