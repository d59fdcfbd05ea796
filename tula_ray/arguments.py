"""Checks of user arguments, shared by every entry point (search, train, tune, the CLI).

Each check raises a ValueError (a value out of range) or a TypeError (a value of the
wrong type) whose message names the argument, the value given and what is allowed,
so that bad input is refused before any Ray trial starts (DEVELOPERS: "Bad input gets a
clear error"). No Ray, no torch here (core module).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Mapping, TypeVar

T = TypeVar("T")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int | None = None,
              optional: bool = False) -> int | None:
    """An integer (not a bool) >= minimum; None too when optional."""
    if value is None and optional:
        return None
    allowed = "an integer" + (f" >= {minimum}" if minimum is not None else "") + (
        " or None" if optional else "")
    if not _is_int(value):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False,
                 optional: bool = False) -> float | None:
    """A finite real number within [low, high] (open ends where asked); None when optional."""
    if value is None and optional:
        return None
    left = "(" if low_open else "["
    right = ")" if high_open else "]"
    span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    allowed = f"a number within {span}" + (" or None" if optional else "")
    if not _is_number(value):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    value = float(value)
    inside = not math.isnan(value) and not math.isinf(value)
    if low is not None:
        inside &= value > low if low_open else value >= low
    if high is not None:
        inside &= value < high if high_open else value <= high
    if not inside:
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    """One of `allowed` (strings)."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        error = ValueError if isinstance(value, str) else TypeError
        raise error(f"{name}={value!r} is not allowed; use one of {allowed}")
    return value


def check_text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """A non-empty string (a name, a path); None when optional."""
    if value is None and optional:
        return None
    allowed = "a non-empty string" + (" or None" if optional else "")
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r}; it must be {allowed}")
    if not value:
        raise ValueError(f"{name}={value!r}; it must be {allowed}")
    return value


def check_bool(name: str, value: Any, *, optional: bool = False) -> bool | None:
    """True or False; None when optional."""
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}; it must be True or False"
                        + (" or None" if optional else ""))
    return value


def check_mapping(name: str, value: Any, *, allowed_keys: Iterable[str] | None = None,
                  optional: bool = True) -> dict[str, Any]:
    """A dict with string keys (None is {} when optional); unknown keys are named."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}={value!r}; it must be a dict" + (" or None" if optional else ""))
    bad = [key for key in value if not isinstance(key, str)]
    if bad:
        raise TypeError(f"{name} has the key {bad[0]!r}; keys must be strings")
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
