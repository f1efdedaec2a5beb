"""Griffe extension for the API pages: the package's re-export conventions make names public.

The `__init__.py` files re-export their public names as `from ._x import Name as Name` (PEP 484's
redundant alias) and, in `workbench.particles`, `from ._x import *` of modules that define
`__all__`. Griffe treats imported names as private unless the module defines `__all__`; this
extension marks those two kinds of imports public, as the packages `griffe-public-redundant-alias`
and `griffe-public-wildcard-import` do, without adding them as dependencies.
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

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        def visit(module: griffe.Module) -> None:
            for member in module.members.values():
                if member.is_alias:
                    if member.wildcard_imported:
                        member.public = True
                elif member.is_module:
                    visit(member)

        visit(pkg)
