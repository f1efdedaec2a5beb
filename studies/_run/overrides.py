"""Typed overrides of a study's `Config` from command-line text (`--field value`).

Each value is read according to the type annotation of the dataclass field it sets, so
`--steps 16` gives the int `16`, `--tolerance 1e-8` the float `1e-8`, `--sizes 8,16,32` the tuple
`(8, 16, 32)`. Every error is a `OverrideError` (a `ValueError`) that names the field, the text
given and what was expected, and is raised before any compute.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "OverrideError",
    "apply_overrides",
    "config_fields",
    "describe_fields",
    "did_you_mean",
    "field_docs",
    "parse_overrides",
    "parse_value",
    "type_name",
]

_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")
_NONE_WORDS = ("none", "null")
_SUPPORTED = (
    "int, float, bool, str, tuple[int, ...], tuple[float, ...], tuple[str, ...], "
    "Literal[...] of str or int, and X | None of these"
)


class OverrideError(ValueError):
    """A command-line override names no field of the config, or its value cannot be read."""


class _BadValue(Exception):
    """Internal: `text` cannot be read as the type; the message says why (may be empty)."""


def config_fields(config_cls: type) -> dict[str, Any]:
    """The init fields of the dataclass `config_cls` with their resolved type annotations.

    String annotations (from `from __future__ import annotations`) are resolved in the module
    that defines the class.
    """
    if not (dataclasses.is_dataclass(config_cls) and isinstance(config_cls, type)):
        raise TypeError(f"config_fields: {config_cls!r} is not a dataclass type.")
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls) if f.init}


def type_name(tp: Any) -> str:
    """A short readable name of a field type, as used in messages: `int`, `tuple[int, ...]`,
    `int | None`, `one of 'lie', 'strang'`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return "tuple[" + ", ".join(type_name(a) for a in args) + "]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def parse_value(text: str, tp: Any, *, field: str = "value") -> Any:
    """Read the command-line text `text` as a value of type `tp`.

    - `int`: decimal integer (`"16"`, `"-3"`); `float`: anything `float()` accepts (`"1e-8"`,
      `"nan"`, `"inf"`);
    - `bool`: `true/false`, `1/0`, `yes/no` (any case);
    - `str`: the text as it is;
    - `tuple[T, ...]`: comma-separated values of `T` (`"8,16,32"`; the empty text gives `()`);
      a fixed-length `tuple[T1, T2]` needs exactly that many values;
    - `Literal[...]`: one of the listed values;
    - `X | None`: `none` or `null` (any case) gives `None`, anything else is read as `X`.

    **Raises:** `OverrideError` naming `field`, the text and the expected type.
    """
    try:
        return _parse(text, tp)
    except _BadValue as e:
        detail = f" ({e})" if str(e) else ""
        raise OverrideError(
            f"field {field!r}: cannot read {text!r} as {type_name(tp)}{detail}."
        ) from None
    except _Unsupported:
        raise OverrideError(
            f"field {field!r} has type {type_name(tp)}, which cannot be set from the command "
            f"line; supported types: {_SUPPORTED}."
        ) from None


def parse_overrides(
    config_cls: type, pairs: Sequence[tuple[str, str | None]], *, study: str | None = None
) -> dict[str, Any]:
    """Turn `(name, text)` pairs from the command line into typed field values.

    Names may use `-` for `_` (`--num-steps` sets `num_steps`). A `bool` field is also a switch:
    `--x64` alone sets it true, `--no-x64` false.

    **Arguments:**

    - `config_cls`: the study's `Config` dataclass.
    - `pairs`: `(field name, text)`; `text` is `None` when the command line gave no value.
    - `study`: the study name, for messages.

    **Returns:** `{field name: typed value}`.

    **Raises:** `OverrideError` for an unknown field (listing the valid fields), a missing or
    unreadable value (naming the field, the text and the expected type), or a field given twice.
    """
    fields = config_fields(config_cls)
    of_study = f" of study {study!r}" if study else ""
    values: dict[str, Any] = {}
    given: dict[str, str] = {}
    for raw_name, text in pairs:
        name = raw_name.replace("-", "_")
        if name not in fields and name.startswith("no_") and fields.get(name[3:]) is bool:
            if text is not None:  # --no-x64 is a switch
                raise OverrideError(
                    f"--{raw_name}{of_study} takes no value (given {text!r}); write "
                    f"--{raw_name} alone, or --{name[3:]} true/false."
                )
            name, text = name[3:], "false"
        elif name in fields and fields[name] is bool and text is None:
            text = "true"  # --x64 alone
        if name in ("x64", "no_x64") and name not in fields:
            raise OverrideError(
                f"--{raw_name}: study{f' {study!r}' if study else ''} has no precision switch; it "
                "sets its own precision (its --help says which)."
            )
        if name not in fields:
            shown = "" if text is None else f" (given value {text!r})"
            valid = ", ".join(fields) if fields else "(none)"
            raise OverrideError(
                f"unknown field {raw_name!r}{shown}{of_study}{did_you_mean(name, fields)}; "
                f"valid fields: {valid}."
            )
        if text is None:
            raise OverrideError(
                f"field {name!r}{of_study} has no value; write --{name} VALUE with a "
                f"{type_name(fields[name])}."
            )
        if name in given:
            raise OverrideError(
                f"field {name!r}{of_study} is given twice ({given[name]!r} and {text!r}); "
                "give it once."
            )
        given[name] = text
        values[name] = parse_value(text, fields[name], field=name)
    return values


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """`dataclasses.replace(config, **overrides)`: a new config; `config` is unchanged."""
    return dataclasses.replace(config, **overrides)


def _article(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def did_you_mean(name: str, choices) -> str:
    """`" (did you mean 'x'?)"` for the closest of `choices` to `name` (`difflib`), or `""`."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def field_docs(config_cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass's fields: the string literal right after each
    field in the class body (read from the source with `ast`; `{}` without source)."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for cls in reversed(config_cls.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def describe_fields(config_cls: type, smoke: Any | None = None, *, width: int = 100) -> str:
    """Per field: `--name TYPE  default: …` (and the smoke value where it differs), then its
    meaning (the field's docstring) indented below, wrapped at `width`.

    **Arguments:**

    - `config_cls`: the `Config` dataclass.
    - `smoke`: an instance from `smoke_config()`, or `None`.
    """
    import textwrap

    fields = config_fields(config_cls)
    defaults = {f.name: f for f in dataclasses.fields(config_cls)}
    docs = field_docs(config_cls)
    rows = []
    for name, tp in fields.items():
        default = _default_text(defaults[name])
        if smoke is not None:
            smoke_value = getattr(smoke, name)
            if default is None or _format(smoke_value) != default:
                default = f"{default or '(required)'}, smoke: {_format(smoke_value)}"
        rows.append((name, f"--{name} {type_name(tp)}", default or "(required)"))
    left_width = max((len(left) for _, left, _ in rows), default=0)
    lines = []
    for name, left, right in rows:
        lines.append(f"  {left.ljust(left_width)}  default: {right}")
        if name in docs:
            lines += textwrap.wrap(
                docs[name], width, initial_indent=" " * 6, subsequent_indent=" " * 6
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Parsing by type
# --------------------------------------------------------------------------------------------


class _Unsupported(Exception):
    """Internal: the field type has no command-line form."""


def _parse(text: str, tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return _parse_literal(text, args)
    if origin in (typing.Union, types.UnionType):
        return _parse_union(text, args)
    if origin is tuple:
        return _parse_tuple(text, args)
    if tp is typing.Any:
        raise _Unsupported
    parser = _SCALAR_PARSERS.get(tp)
    if parser is None:
        raise _Unsupported
    return parser(text)


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _BadValue("expected a whole number such as 16 or -3") from None


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise _BadValue("expected a number such as 0.5 or 1e-8") from None


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise _BadValue("use true/false, 1/0 or yes/no")


def _parse_str(text: str) -> str:
    return text


_SCALAR_PARSERS: dict[Any, Callable[[str], Any]] = {
    int: _parse_int,
    float: _parse_float,
    bool: _parse_bool,
    str: _parse_str,
}


def _parse_literal(text: str, choices: tuple[Any, ...]) -> Any:
    for choice in choices:
        if isinstance(choice, str) and text == choice:
            return choice
        if isinstance(choice, int) and not isinstance(choice, bool):
            try:
                if int(text.strip()) == choice:
                    return choice
            except ValueError:
                pass
    raise _BadValue("valid choices: " + ", ".join(str(c) for c in choices))


def _parse_union(text: str, members: tuple[Any, ...]) -> Any:
    rest = tuple(m for m in members if m is not type(None))
    if len(rest) < len(members) and text.strip().lower() in _NONE_WORDS:
        return None
    if len(rest) != 1:
        # A union of several non-None types would make the reading ambiguous.
        raise _Unsupported
    return _parse(text, rest[0])


def _parse_tuple(text: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    items = [] if text.strip() == "" else [t.strip() for t in text.split(",")]
    if len(args) == 2 and args[1] is Ellipsis:
        types_ = [args[0]] * len(items)
    elif not args:
        raise _Unsupported
    else:
        types_ = list(args)
        if len(items) != len(types_):
            raise _BadValue(f"expected {len(types_)} comma-separated values, got {len(items)}")
    out = []
    for i, (item, tp) in enumerate(zip(items, types_, strict=True)):
        if item == "":
            raise _BadValue(f"item {i} is empty")
        try:
            out.append(_parse(item, tp))
        except _BadValue:
            raise _BadValue(f"item {i} = {item!r} is not {_article(type_name(tp))}") from None
    return tuple(out)


def _default_text(field: dataclasses.Field) -> str | None:
    if field.default is not dataclasses.MISSING:
        return _format(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _format(field.default_factory())
    return None


def _format(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else '""'
    return str(value)
