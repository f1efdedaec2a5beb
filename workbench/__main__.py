"""`python -m workbench ...` is the `workbench` command."""

from .cli import main

raise SystemExit(main())
