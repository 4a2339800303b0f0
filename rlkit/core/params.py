"""Strict parameters: one frozen dataclass per experiment, unknown or missing keys are errors.

Papermill only warns about parameters a notebook does not declare; a typo in a sweep would then run
the default silently. Every experiment therefore validates its parameters into a frozen dataclass
with :func:`build`, which names the offending key, the known keys and the fix.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


class ParamError(ValueError):
    """Bad experiment parameters; the message names the key and the fix."""


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def required_names(cls) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _coerce(name: str, value: Any, annotation: Any, owner: str) -> Any:
    """Check ``value`` against a simple annotation; ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(annotation):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(name, value, option, owner)
            except ParamError as err:
                errors.append(str(err))
        raise ParamError(f"{owner}.{name}: {value!r} matches none of {annotation}")
    if origin is typing.Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ParamError(f"{owner}.{name}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ParamError(f"{owner}.{name}: expected a list, got {type(value).__name__} {value!r}")
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        item = args[0] if args else Any
        items = [_coerce(f"{name}[{i}]", v, item, owner) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is bool and not isinstance(value, bool):
        raise ParamError(f"{owner}.{name}: expected true/false, got {value!r}")
    if isinstance(annotation, type) and not isinstance(value, annotation):
        raise ParamError(
            f"{owner}.{name}: expected {annotation.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def check_keys(given, known, required, *, where: str, owner: str, missing_fix: str) -> None:
    """The one strict key check: every key of ``given`` is ``known`` and every ``required`` key is given.

    Raises :class:`ParamError` naming the offending keys, the known ones and the fix.
    """
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ParamError(f"unknown {where} {unknown} for {owner}; known keys: {list(known)}. "
                         f"Fix: correct the spelling or remove the key.")
    missing = [k for k in required if k not in given]
    if missing:
        raise ParamError(f"missing {where} {missing} for {owner}. Fix: {missing_fix} (known keys: {list(known)}).")


def build(cls: type[T], values: Mapping[str, Any], *, where: str = "parameters") -> T:
    """Validate ``values`` into the frozen dataclass ``cls``.

    Raises :class:`ParamError` for unknown keys, missing required keys and wrongly typed values.
    """
    check_keys(values, field_names(cls), required_names(cls), where=where, owner=cls.__name__, missing_fix="set them")
    hints = typing.get_type_hints(cls)
    checked = {k: _coerce(k, v, hints.get(k, Any), cls.__name__) for k, v in values.items()}
    return cls(**checked)


def from_namespace(cls: type[T], namespace: Mapping[str, Any]) -> T:
    """Build ``cls`` from a notebook's globals: takes exactly the dataclass fields, all required.

    Used as the one validation line after a notebook's ``parameters`` cell. Unknown keys are caught
    earlier, by the runner, which compares papermill parameters with the notebook's declared ones.
    """
    names = field_names(cls)
    missing = [n for n in names if n not in namespace]
    if missing:
        raise ParamError(
            f"the parameters cell does not define {missing} required by {cls.__name__}. "
            f"Fix: add them to the cell tagged 'parameters'."
        )
    return build(cls, {n: namespace[n] for n in names})


def as_dict(obj) -> dict[str, Any]:
    out = dataclasses.asdict(obj)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
