"""Argument checks for the engine's public API.

Every public entry point checks its arguments up front, before any work or state change, so a bad call
costs nothing and leaves nothing behind. A refusal names the argument, shows the value (repr, cut short)
and says the rule:

    max_num_seqs must be an integer >= 1 (got '16': str)

A wrong type raises `ArgumentTypeError`, a value out of range `ValueError`.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Any

import numpy as np
import torch

REPR_CHARS = 40  # how much of a refused value a message quotes


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type.

    A TypeError, and also a ValueError: callers (the app, scripts) that catch ValueError for "bad input" keep
    working for every refusal, whatever its kind.
    """


class StepFailed(RuntimeError):
    """A step raised and was undone: the engine is exactly as before the step (the cause is chained)."""


def short_repr(value: Any, limit: int = REPR_CHARS) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not replace the real message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _got(value: Any) -> str:
    return f"(got {short_repr(value)}: {type(value).__name__})"


def type_error(name: str, rule: str, value: Any) -> ArgumentTypeError:
    return ArgumentTypeError(f"{name} must be {rule} {_got(value)}")


def value_error(name: str, rule: str, value: Any) -> ValueError:
    return ValueError(f"{name} must be {rule} (got {short_repr(value)})")


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def as_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi]. numpy integers count; bool and float do not (True is never meant as 1)."""
    if _is_bool(value) or isinstance(value, (float, np.floating)):
        raise type_error(name, _int_rule(lo, hi), value)
    try:
        v = operator.index(value)
    except TypeError:
        raise type_error(name, _int_rule(lo, hi), value) from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise value_error(name, _int_rule(lo, hi), v)
    return v


def _int_rule(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"an integer in [{lo}, {hi}]"
    if lo is not None:
        return f"an integer >= {lo}"
    if hi is not None:
        return f"an integer <= {hi}"
    return "an integer"


def as_real(name: str, value: Any) -> float:
    """A finite real number (int or float, numpy ones too; not bool)."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise type_error(name, "a number", value)
    v = float(value)
    if not math.isfinite(v):
        raise value_error(name, "finite", value)
    return v


def as_bool(name: str, value: Any) -> bool:
    """A real bool (numpy's too). Strings such as "no" are truthy, so anything else is refused."""
    if not _is_bool(value):
        raise type_error(name, "a bool (True or False)", value)
    return bool(value)


def as_text(name: str, value: Any, max_chars: int, optional: bool = False) -> str | None:
    """A str of at most max_chars characters that is valid Unicode (no lone surrogates).

    The length is checked first, so an oversized string is refused before any per-character work.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise type_error(name, "a str" + (" or None" if optional else ""), value)
    if len(value) > max_chars:
        raise ValueError(f"{name} is {len(value)} characters, more than the limit of {max_chars} "
                         f"(got {short_repr(value)})")
    check_unicode(name, value)
    return value


def check_unicode(name: str, text: str) -> None:
    """Refuse lone surrogates (e.g. from JSON "\\ud800"): no tokenizer or UTF-8 encoder can take them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} contains a lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start}; "
                         f"text must be valid Unicode (got {short_repr(text)})") from None


def as_token_ids(name: str, ids: Any, vocab_size: int, max_len: int | None = None) -> list[int]:
    """A non-empty sequence of token ids in [0, vocab_size) as plain ints (a list, tuple, range, 1-D integer
    numpy array or torch tensor). Too long is refused before converting element by element."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise type_error(name, "a 1-D integer tensor or a list of ints", ids)
    elif isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise type_error(name, "a 1-D integer array or a list of ints", ids)
    elif not isinstance(ids, (list, tuple, range)):  # a str, bytes, dict or set is never a list of ids
        raise type_error(name, "a list of token ids (ints)", ids)
    n = len(ids)
    if n == 0:
        raise ValueError(f"{name} must not be empty")
    if max_len is not None and n > max_len:
        raise ValueError(f"{name} has {n} tokens, more than the limit of {max_len} (the model's context "
                         f"minus one position to generate)")
    if isinstance(ids, (torch.Tensor, np.ndarray)):
        ids = ids.tolist()  # integer dtype checked above: plain ints
    out = []
    for i, t in enumerate(ids):
        if type(t) is not int:  # the common case (plain ints) skips the slower checks
            t = as_int(f"{name}[{i}]", t)
        if not 0 <= t < vocab_size:
            raise value_error(f"{name}[{i}]", f"a token id in [0, {vocab_size})", t)
        out.append(t)
    return out


def as_instance(name: str, value: Any, cls: type, optional: bool = False):
    if value is None and optional:
        return None
    if not isinstance(value, cls):
        raise type_error(name, f"a {cls.__name__}" + (" or None" if optional else ""), value)
    return value
