"""`Table`: the names of one kind of option mapped to their objects (the registry's building block).

Each kind of option that the command line names (splitting schemes, ODE solvers, sphere
integrators, quadrature rules, activations, ...) has one `Table`, defined next to the objects it
names; `workbench.registry` collects them. A name is mapped to its object once, at the edge, with
`Table.lookup`, whose error names the argument, the bad value, the kind and the valid names.
"""

import difflib
from collections.abc import Iterator, Mapping
from typing import TypeVar

_V = TypeVar("_V")


class Table(Mapping[str, _V]):
    """A read-only table of one kind of option: each name maps to one object.

    Indexing (`table[name]`) is plain `Mapping` access (a `KeyError`), for names already checked;
    `lookup` is for names from a user.

    **Arguments:**

    - `kind`: the kind of option, the key `workbench.registry.lookup` takes, e.g.
      `"sphere_integrator"`.
    - `noun`: what one entry is, for messages, e.g. `"sphere integrator"`.
    - `entries`: name → object; names are non-empty strings, in the order messages list them.

    **Example:** `Table("rule", "quadrature rule", {"midpoint": MidpointRule()}).lookup("mid")`
    raises `rule='mid' is not a known quadrature rule; valid choices: midpoint. Did you mean
    'midpoint'?`.
    """

    __slots__ = ("_entries", "_kind", "_noun")

    def __init__(self, kind: str, noun: str, entries: Mapping[str, _V]):
        entries = dict(entries)
        bad = [name for name in entries if not isinstance(name, str) or not name]
        if bad:
            raise ValueError(f"Table {kind!r}: names must be non-empty strings; got {bad!r}.")
        self._kind, self._noun, self._entries = kind, noun, entries

    @property
    def kind(self) -> str:
        """The kind of option (`workbench.registry.lookup`'s first argument)."""
        return self._kind

    @property
    def noun(self) -> str:
        """What one entry is (`"sphere integrator"`), for messages."""
        return self._noun

    def __getitem__(self, name: str) -> _V:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Table({self._kind!r}: {', '.join(self._entries)})"

    def lookup(self, name: str, *, field: str | None = None) -> _V:
        """The object called `name`.

        **Arguments:** `name`; `field`, the argument the name came from, for the message
        (default: the table's `kind`).

        **Raises:** `ValueError` naming `field`, the bad value, the kind and the valid names, with
        the closest valid name when one is close.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            field = self._kind if field is None else field
            raise ValueError(
                f"{field}={name!r} is not a known {self._noun}; valid choices: "
                f"{', '.join(self._entries)}.{self._suggestion(name)}"
            ) from None

    def _suggestion(self, name) -> str:
        if not isinstance(name, str):
            return ""
        close = difflib.get_close_matches(name, list(self._entries), n=1)
        # A qualified name the user shortened (`"rk4"` for `"unsplit-rk4"`) is not "close" to
        # difflib; suggest it when exactly one valid name contains the given one.
        if not close:
            close = [n for n in self._entries if name and name.lower() in n.lower()]
        return f" Did you mean {close[0]!r}?" if len(close) == 1 else ""
