"""The JSON round trip of textgen's frozen dataclasses: to a JSON-ready dict, and back with every key and value
checked against the field's type, so that a damaged or foreign file is one error naming the key."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

from textgen.errors import ConfigError, shown

T = TypeVar("T")


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config as a JSON-ready dict (tuples as lists, as JSON reads them back)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Rebuild a config from what JSON read, the section ``where`` of a file; a key or value that does not fit
    its fields is one error naming it (unknown keys mean a file from another version)."""
    problem = json_problem(data, cls, where)
    if problem:
        raise ConfigError(problem)
    return cls(**data)


def json_problem(value: Any, kind: Any, where: str) -> str | None:
    """What keeps ``value``, read from JSON at ``where`` (``training.lr``), from being of type ``kind``: a type
    annotation of textgen's (a dataclass, ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, an enum, a plain
    type); None if nothing does. Values are checked, not ranges (the dataclasses check those)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (kind,) = (arg for arg in args if arg is not type(None))  # textgen's unions are X | None
        return json_problem(value, kind, where)
    if origin is tuple:  # tuple[X, ...]: a JSON array
        if not isinstance(value, list | tuple):
            return f"{where}={shown(value)}, not a list"
        return next((p for i, v in enumerate(value) if (p := json_problem(v, args[0], f"{where}[{i}]"))), None)
    if origin is dict:  # dict[str, X]: a JSON object
        if not isinstance(value, dict):
            return f"{where}={shown(value)}, not an object"
        return next((p for k, v in value.items() if (p := json_problem(v, args[1], _key(where, k)))), None)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _fields_problem(value, kind, where)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        names = [member.value for member in kind]
        return None if value in names else f"{where}={shown(value)}, not {' or '.join(map(str, names))}"
    if kind is float:
        fits = isinstance(value, int | float) and not isinstance(value, bool)  # JSON's true is no number
    elif kind is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, kind)
    return None if fits else f"{where}={shown(value)}, not {_KINDS.get(kind, kind.__name__)}"


_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _fields_problem(value: Any, cls: type, where: str) -> str | None:
    """``json_problem`` for a dataclass: a JSON object with a fitting value for each field it has, and every field
    without a default."""
    if not isinstance(value, dict):
        return f"{where or cls.__name__}={shown(value)}, not an object"
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        return f"unknown {where or cls.__name__} keys {unknown}: written by another textgen version?"
    kinds = typing.get_type_hints(cls)
    for name, field in fields.items():
        if name in value:
            problem = json_problem(value[name], kinds[name], _key(where, name))
            if problem:
                return problem
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            return f"no {_key(where, name)}"
    return None


def _key(where: str, name: object) -> str:
    return f"{where}.{name}" if where else str(name)
