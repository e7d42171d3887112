"""The API's value formats: Go durations, Kubernetes quantities, decimal money and RFC 3339 times.

Every parser here is exact: durations are integer nanoseconds (as Go's time.Duration), quantities
and money are `Decimal`s. Nothing goes through float, so `"0.1"` USD is 0.1 USD and `1.5h` is
exactly 5400 s. Each parser raises `ValueError` with a message that can follow `Invalid value: …: `.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

__all__ = [
    "MAX_DURATION_NS", "NS_PER_SECOND",
    "parse_duration_ns", "parse_duration", "duration_seconds", "format_duration", "canonical_duration",
    "parse_quantity", "parse_money", "format_money", "MONEY_PATTERN",
    "parse_time", "format_time", "parse_decimal",
]

# -- durations ---------------------------------------------------------------------------------------

NS_PER_SECOND = 1_000_000_000
MAX_DURATION_NS = (1 << 63) - 1
"""time.Duration is an int64 of nanoseconds (about 292 years)."""

_UNITS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # U+00B5 micro sign, what Go prints
    "\u03bcs": 1_000,  # U+03BC Greek mu, which Go also accepts
    "ms": 1_000_000,
    "s": NS_PER_SECOND,
    "m": 60 * NS_PER_SECOND,
    "h": 3600 * NS_PER_SECOND,
}
_COMPONENT = re.compile(r"([0-9]*)(?:\.([0-9]*))?([a-z\u00b5\u03bc]+)")
DURATION_HINT = 'must be a duration such as "90s", "15m" or "1h30m"'


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string (`time.ParseDuration`) to integer nanoseconds."""
    if not isinstance(text, str):
        raise ValueError(DURATION_HINT)
    s = text
    sign = 1
    if s[:1] in ("-", "+"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(DURATION_HINT)
    total = 0
    pos = 0
    while pos < len(s):
        m = _COMPONENT.match(s, pos)
        if m is None or m.end() == pos:
            raise ValueError(DURATION_HINT)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(DURATION_HINT)  # "." or ".s" carries no digit
        scale = _UNITS.get(unit)
        if scale is None:
            raise ValueError(f'unknown unit "{unit}" in duration; use ns, us, ms, s, m or h')
        value = int(whole or "0") * scale
        if frac:
            # Go truncates what is finer than a nanosecond.
            value += int(frac) * scale // 10 ** len(frac)
        total += value
        if total > MAX_DURATION_NS:
            raise ValueError("duration out of range (at most 2562047h)")
        pos = m.end()
    return sign * total


def parse_duration(text: str) -> timedelta:
    """A Go duration as a timedelta (microsecond resolution; finer parts are truncated)."""
    return timedelta(microseconds=parse_duration_ns(text) // 1000)


def duration_seconds(text: str) -> Decimal:
    """A Go duration as exact Decimal seconds."""
    return Decimal(parse_duration_ns(text)) / NS_PER_SECOND


def _frac(v: int, prec: int) -> tuple[int, str]:
    digits = f"{v % 10 ** prec:0{prec}d}".rstrip("0")
    return v // 10 ** prec, ("." + digits if digits else "")


def format_duration(value: int | timedelta | Decimal) -> str:
    """Go's `time.Duration.String()`: `1h0m0s`, `1m30s`, `1.5s`, `300ms`, `0s`.

    An int is nanoseconds; a Decimal is seconds; a timedelta is itself.
    """
    if isinstance(value, timedelta):
        ns = (value.days * 86_400 + value.seconds) * NS_PER_SECOND + value.microseconds * 1000
    elif isinstance(value, Decimal):
        ns = int(value * NS_PER_SECOND)
    else:
        ns = int(value)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < NS_PER_SECOND:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            whole, frac = _frac(u, 3)
            return f"{sign}{whole}{frac}\u00b5s"
        whole, frac = _frac(u, 6)
        return f"{sign}{whole}{frac}ms"
    secs, frac = _frac(u, 9)
    out = f"{secs % 60}{frac}s"
    minutes = secs // 60
    if minutes:
        out = f"{minutes % 60}m" + out
        hours = minutes // 60
        if hours:
            out = f"{hours}h" + out
    return sign + out


def canonical_duration(text: str) -> str:
    """Parse and print back in Go's canonical form (`"3600s"` → `"1h0m0s"`)."""
    return format_duration(parse_duration_ns(text))


# -- quantities --------------------------------------------------------------------------------------

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
QUANTITY_HINT = 'must be a quantity such as "512Mi", "1Ti", "2" or "500m"'


def parse_quantity(text: str | int) -> Decimal:
    """A Kubernetes resource.Quantity as an exact Decimal (`"512Mi"` → 536870912)."""
    if isinstance(text, bool):
        raise ValueError(QUANTITY_HINT)
    if isinstance(text, int):
        return Decimal(text)
    if not isinstance(text, str):
        raise ValueError(QUANTITY_HINT)
    m = _QUANTITY.match(text)
    if m is None:
        raise ValueError(QUANTITY_HINT)
    number, exponent, suffix = m.group(1), m.group(2), m.group(3)
    try:
        value = Decimal(number)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(QUANTITY_HINT) from exc
    if exponent:
        e = int(exponent[1:])
        if abs(e) > 100:
            raise ValueError("quantity exponent out of range")
        return value.scaleb(e)
    if suffix in _BINARY:
        return value * (1024 ** _BINARY[suffix])
    return value.scaleb(_DECIMAL[suffix or ""])


# -- money -------------------------------------------------------------------------------------------

MONEY_PATTERN = r"^(0|[1-9][0-9]{0,11})(\.[0-9]{1,6})?$"
"""Decimal USD: up to 12 integer digits, up to 6 fraction digits (a millionth of a dollar)."""
_MONEY = re.compile(MONEY_PATTERN)
MONEY_HINT = 'must be a decimal USD string such as "12.50" (at most 6 decimal places)'


def parse_money(text: str) -> Decimal:
    """A USD amount. Only strings: a JSON number is refused because money is never a float."""
    if not isinstance(text, str):
        raise ValueError(MONEY_HINT + "; a JSON number is not accepted")
    if _MONEY.match(text) is None:
        raise ValueError(MONEY_HINT)
    return Decimal(text)


def format_money(value: Decimal) -> str:
    """At least two decimal places, never an exponent: Decimal("12.5") → "12.50"."""
    if not isinstance(value, Decimal):
        raise TypeError("money is a Decimal")
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):  # "n", "N" or "F": NaN and Infinity are no amount
        raise TypeError(f"money is a finite Decimal, not {value}")
    q = value if -exponent >= 2 else value.quantize(Decimal("0.01"))
    return format(q, "f")


_DECIMAL_STRING = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")


def parse_decimal(text: str) -> Decimal:
    """A plain decimal string (`"0.05"`), as used for fractions and metrics."""
    if not isinstance(text, str) or _DECIMAL_STRING.match(text) is None:
        raise ValueError('must be a decimal string such as "0.05"')
    return Decimal(text)


# -- times -------------------------------------------------------------------------------------------

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
TIME_HINT = 'must be an RFC 3339 time such as "2025-01-31T18:00:00Z"'


def parse_time(text: str) -> datetime:
    """An RFC 3339 time with an explicit offset, as an aware datetime in UTC."""
    if not isinstance(text, str):
        raise ValueError(TIME_HINT)
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(TIME_HINT)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, offset = m.group(7), m.group(8)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    if offset in ("Z", "z"):
        tz = timezone.utc
    else:
        sign = -1 if offset[0] == "-" else 1
        oh, om = int(offset[1:3]), int(offset[4:6])
        if oh > 23 or om > 59:
            raise ValueError(TIME_HINT)
        tz = timezone(sign * timedelta(hours=oh, minutes=om))
    try:
        dt = datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz)
    except ValueError as exc:
        raise ValueError(TIME_HINT) from exc
    return dt.astimezone(timezone.utc)


def format_time(dt: datetime) -> str:
    """RFC 3339 in UTC with `Z`, with microseconds only when there are any."""
    if dt.tzinfo is None:
        raise ValueError("format_time needs an aware datetime")
    dt = dt.astimezone(timezone.utc)
    if dt.microsecond:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0") + "Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
