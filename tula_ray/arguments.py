"""Checks of user arguments, shared by every entry point (search, train, tune, the CLI).

Each check raises a ValueError (a value out of range) or a TypeError (a value of the
wrong type) whose message names the argument, the value given and what is allowed,
so that bad input is refused before any Ray trial starts (DEVELOPERS: "Bad input gets a
clear error"). `hint`, where given, ends the message with what the argument means or
what to do. Every module checks its arguments here, never by hand (tests/test_arguments.py
holds that). No Ray, no torch, no numpy here (core module).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Callable, Iterable, Mapping, TypeVar

T = TypeVar("T")


def _is_int(value: Any, numpy: bool = False) -> bool:
    kind = numbers.Integral if numpy else int  # numpy registers its integers as Integral
    return isinstance(value, kind) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ending(hint: str) -> str:
    return f" ({hint})" if hint else ""


def check_int(name: str, value: Any, *, minimum: int | None = None,
              maximum: int | None = None, optional: bool = False, numpy: bool = False,
              hint: str = "") -> int | None:
    """An integer (not a bool) within [minimum, maximum]; None too when optional.

    numpy: numpy's integers (any `numbers.Integral`) count as integers too; the value is
    returned as given.
    """
    if value is None and optional:
        return None
    if minimum is not None and maximum is not None:
        span = f" in [{minimum}, {maximum}]"
    else:
        span = (f" >= {minimum}" if minimum is not None else "") + (
            f" <= {maximum}" if maximum is not None else "")
    allowed = "an integer" + span + (" or None" if optional else "") + _ending(hint)
    if not _is_int(value, numpy):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False,
                 optional: bool = False, hint: str = "") -> float | None:
    """A real number within [low, high] (open ends where asked); None when optional.

    Finite, unless a bound is itself infinite (`high=math.inf`: inf is allowed).
    """
    if value is None and optional:
        return None
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    allowed = f"a number within {span}" + (" or None" if optional else "") + _ending(hint)
    if not _is_number(value):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    value = float(value)
    inside = not math.isnan(value) and (not math.isinf(value) or value in (low, high))
    if low is not None:
        inside &= value > low if low_open else value >= low
    if high is not None:
        inside &= value < high if high_open else value <= high
    if not inside:
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_choice(name: str, value: Any, allowed: Iterable[str], *, hint: str = "") -> str:
    """One of `allowed` (strings)."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name}={value!r} is not allowed; use one of {allowed}{_ending(hint)}")
    return value


def check_text(name: str, value: Any, *, optional: bool = False,
               hint: str = "") -> str | None:
    """A non-empty string (a name, a path); None when optional."""
    if value is None and optional:
        return None
    allowed = "a non-empty string" + (" or None" if optional else "") + _ending(hint)
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    if not value:
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_bool(name: str, value: Any, *, optional: bool = False,
               hint: str = "") -> bool | None:
    """True or False; None when optional."""
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}; it must be True or False"
                        + (" or None" if optional else "") + _ending(hint))
    return value


def check_mapping(name: str, value: Any, *, allowed_keys: Iterable[str] | None = None,
                  optional: bool = True, hint: str = "") -> dict[str, Any]:
    """A dict with string keys (None is {} when optional); unknown keys are named."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}={value!r}; it must be a dict" + (" or None" if optional else "")
                        + _ending(hint))
    bad = [key for key in value if not isinstance(key, str)]
    if bad:
        raise TypeError(f"{name} has the key {bad[0]!r}; keys must be strings{_ending(hint)}")
    if allowed_keys is not None:
        allowed = tuple(allowed_keys)
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(f"{name} has the unknown key {unknown[0]!r}; allowed: "
                             f"{list(allowed) or 'none'}")
    return dict(value)


def named_arguments(function: Callable[..., T], *names: str) -> Callable[..., T]:
    """`function`, whose ValueError or TypeError then names the arguments its input came from.

    For checks that live elsewhere (a workload's options, a strategy's options): their
    message names the option, this adds the argument the user passed it in.
    """
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return function(*args, **kwargs)
        except (ValueError, TypeError) as error:
            if all(name in str(error) for name in names):
                raise
            kind = TypeError if isinstance(error, TypeError) else ValueError
            raise kind(f"{', '.join(names)}: {error}") from error

    return call
