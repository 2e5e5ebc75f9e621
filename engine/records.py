"""Typed records and their JSON form, shared by the engine's events and everything that stores or sends them.

`Record` is the base of the parts of a step event (engine/events.py, and the KV, cost, timing and speculative
records beside the code that fills them): `to_dict()` gives plain JSON values, `from_dict()` builds the record
back, nested records included. `dumps` is the one JSON encoder of the project: strict (no NaN/Infinity),
readable UTF-8, compact. This module imports nothing else of the engine, so every engine module and the app
can use it.
"""
from __future__ import annotations

import functools
import json
import math
import types
import typing
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any, Callable, ClassVar

import torch


def dumps(value: Any) -> str:
    """Strict JSON text: NaN/Infinity are refused (a browser's JSON.parse would refuse them later, with a worse
    message), non-ASCII text stays readable (Russian prompts stay Russian), no spaces."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def jsonable(value: Any, digits: int = 6) -> Any:
    """Convert records/tensors/floats into JSON-safe values: floats rounded to `digits`, non-finite ones None."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_floating_point():
            return jsonable(value.float().tolist(), digits)
        return value.tolist()
    if isinstance(value, Record):
        digits = value.JSON_DIGITS or digits
        return {k: jsonable(v, digits) for k, v in vars(value).items()}
    if hasattr(value, "to_dict") and not isinstance(value, type):
        return jsonable(value.to_dict(), digits)
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value), digits)
    if isinstance(value, float):
        return round(value, digits) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, digits) for v in value]
    return value


def build(cls: type, data: Any, convert: dict[str, Callable[[Any], Any]] | None = None) -> Any:
    """An instance of dataclass `cls` from its to_dict() form, generic over the dataclass's fields.

    Keys the class does not declare are ignored and optional fields that are absent keep their defaults, so
    a record written by a newer or older engine still loads. Fields declared as a record (or a list of
    records, or either or None) are built with that record's from_dict; `convert` turns other JSON values back
    into the types the charts read (int dict keys, tensors). A malformed value is a one-line ValueError.
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    declared = [f for f in fields(cls) if f.init]
    kwargs = {f.name: data[f.name] for f in declared if f.name in data}
    missing = [f.name for f in declared
               if f.name not in kwargs and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} is missing {', '.join(missing)}")
    for name, fn in {**_nested(cls), **(convert or {})}.items():
        if kwargs.get(name) is not None:
            try:
                kwargs[name] = fn(kwargs[name])
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{cls.__name__}.{name} is malformed ({exc})") from None
    return cls(**kwargs)


@functools.cache
def _nested(cls: type) -> dict[str, Callable[[Any], Any]]:
    """from_dict of every field of `cls` whose declared type is a record, a list of records, or either or None."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = rest[0] if len(rest) == 1 else None
        if typing.get_origin(hint) is list and typing.get_args(hint):
            item = typing.get_args(hint)[0]
            if hasattr(item, "from_dict"):
                out[name] = functools.partial(_build_list, item)
        elif isinstance(hint, type) and hasattr(hint, "from_dict") and is_dataclass(hint):
            out[name] = hint.from_dict
    return out


def _build_list(item: type, xs: Any) -> list:
    if not isinstance(xs, list):
        raise ValueError(f"expected a list, got {type(xs).__name__}")
    return [item.from_dict(x) for x in xs]


class Record:
    """Base of a dataclass that travels as JSON (exports, replayed traces, websockets).

    to_dict(): its fields in declaration order as plain JSON values (floats rounded to JSON_DIGITS, or to the
    digits of the record it sits in); from_dict(): the inverse, see `build`.
    """

    JSON_DIGITS: ClassVar[int | None] = None

    def to_dict(self) -> dict:
        return jsonable(self)

    @classmethod
    def from_dict(cls, data: dict):
        return build(cls, data)
