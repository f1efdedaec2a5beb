"""`python -m studies ...` is the `workbench` command."""

from .cli import main

raise SystemExit(main())
