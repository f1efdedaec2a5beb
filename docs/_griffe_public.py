"""Griffe extension for the API pages: the package's re-export convention makes names public.

The `__init__.py` files re-export their public names as `from ._x import Name as Name` (PEP 484's
redundant alias). Griffe treats imported names as private unless the module defines `__all__`; this
extension marks those imports public, as the package `griffe-public-redundant-alias` does, without
adding it as a dependency. Names a package does not re-export stay private.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


class PublicReexports(griffe.Extension):
    def on_alias_instance(self, *, node: Any, alias: griffe.Alias, **kwargs: Any) -> None:
        if isinstance(node, ast.ImportFrom):
            for name in node.names:
                if name.asname is not None and name.asname == name.name == alias.name:
                    alias.public = True
