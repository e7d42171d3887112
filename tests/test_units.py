"""Go durations, Kubernetes quantities, decimal money and RFC 3339 times: exact, and strict."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus.coordinator.api import units


@pytest.mark.parametrize("text, ns", [
    ("0", 0), ("0s", 0), ("90s", 90 * 10**9), ("15m", 900 * 10**9), ("1h30m", 5400 * 10**9),
    ("1.5h", 5400 * 10**9), ("300ms", 300 * 10**6), ("1us", 1000), ("1µs", 1000), ("1μs", 1000), ("2ns", 2),
    (".5s", 5 * 10**8), ("5.s", 5 * 10**9), ("-1m", -60 * 10**9), ("+2h", 7200 * 10**9), ("1h0m0s", 3600 * 10**9),
    ("1.000000001s", 10**9 + 1), ("1.0000000019s", 10**9 + 1),
])
def test_parse_duration(text: str, ns: int) -> None:
    assert units.parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "1", "s", ".", ".s", "1d", "1 h", "h1", "--1s", "1h 30m", "1e3s",
                                  "3000000h", "1H"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        units.parse_duration_ns(text)


def test_parse_duration_refuses_non_strings() -> None:
    with pytest.raises(ValueError):
        units.parse_duration_ns(90)  # type: ignore[arg-type]


@pytest.mark.parametrize("ns, text", [
    (0, "0s"), (1, "1ns"), (1100, "1.1µs"), (2_200_000, "2.2ms"), (3_300_000_000, "3.3s"),
    (4 * 60 * 10**9 + 5 * 10**9, "4m5s"), (4 * 60 * 10**9 + 5_001_000_000, "4m5.001s"),
    (5 * 3600 * 10**9 + 6 * 60 * 10**9 + 7_001_000_000, "5h6m7.001s"), (3600 * 10**9, "1h0m0s"),
    (8 * 60 * 10**9 + 1, "8m0.000000001s"), (-90 * 10**9, "-1m30s"), ((1 << 63) - 1, "2562047h47m16.854775807s"),
])
def test_format_duration_matches_go(ns: int, text: str) -> None:
    assert units.format_duration(ns) == text


def test_format_duration_other_types() -> None:
    assert units.format_duration(timedelta(hours=1, minutes=30)) == "1h30m0s"
    assert units.format_duration(Decimal("1.5")) == "1.5s"
    assert units.canonical_duration("3600s") == "1h0m0s"
    assert units.parse_duration("1.5h") == timedelta(hours=1, minutes=30)
    assert units.duration_seconds("300ms") == Decimal("0.3")


@given(st.integers(min_value=-(1 << 62), max_value=(1 << 62)))
def test_duration_round_trip(ns: int) -> None:
    assert units.parse_duration_ns(units.format_duration(ns)) == ns


@pytest.mark.parametrize("text, value", [
    ("512Mi", Decimal(512 * 2**20)), ("1Ti", Decimal(2**40)), ("2", Decimal(2)), ("500m", Decimal("0.5")),
    ("1e3", Decimal(1000)), ("1E3", Decimal(1000)), ("1.5Gi", Decimal(int(1.5 * 2**30))), ("100k", Decimal(100_000)),
    ("2M", Decimal(2_000_000)), ("1G", Decimal(10**9)), ("3n", Decimal("3e-9")), ("0.1", Decimal("0.1")),
    ("-1", Decimal(-1)), (".5", Decimal("0.5")), ("1E", Decimal(10**18)), (4, Decimal(4)),
])
def test_parse_quantity(text: str | int, value: Decimal) -> None:
    assert units.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Mi", "1 Mi", "1MiB", "1mi", "1KI", "abc", "1.2.3", "0x10", "1e", True, 1.5])
def test_parse_quantity_refuses(text: object) -> None:
    with pytest.raises(ValueError):
        units.parse_quantity(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, value", [
    ("12.50", Decimal("12.50")), ("0", Decimal(0)), ("0.000001", Decimal("0.000001")), ("100", Decimal(100)),
    ("999999999999.999999", Decimal("999999999999.999999")),
])
def test_parse_money(text: str, value: Decimal) -> None:
    assert units.parse_money(text) == value


@pytest.mark.parametrize("value", [12.5, 12, "12.5000001", "-1", "1e3", "01.00", "12.", ".5", " 1", "1,00", "",
                                   "1000000000000", None, True])
def test_parse_money_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        units.parse_money(value)  # type: ignore[arg-type]


def test_money_refuses_json_numbers_with_a_reason() -> None:
    with pytest.raises(ValueError, match="JSON number"):
        units.parse_money(10)  # type: ignore[arg-type]


def test_format_money() -> None:
    assert units.format_money(Decimal("12.5")) == "12.50"
    assert units.format_money(Decimal("3")) == "3.00"
    assert units.format_money(Decimal("0.123456")) == "0.123456"
    with pytest.raises(TypeError):
        units.format_money(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, expected", [
    ("2025-01-31T18:00:00Z", datetime(2025, 1, 31, 18, tzinfo=timezone.utc)),
    ("2025-01-31T20:00:00+02:00", datetime(2025, 1, 31, 18, tzinfo=timezone.utc)),
    ("2025-01-31t18:00:00.5z", datetime(2025, 1, 31, 18, 0, 0, 500000, tzinfo=timezone.utc)),
])
def test_parse_time(text: str, expected: datetime) -> None:
    assert units.parse_time(text) == expected


@pytest.mark.parametrize("text", ["2025-01-31", "2025-01-31T18:00:00", "2025-13-01T00:00:00Z", "2025-02-30T00:00:00Z",
                                  "yesterday", "2025-01-31 18:00:00Z", 1700000000])
def test_parse_time_refuses(text: object) -> None:
    with pytest.raises(ValueError):
        units.parse_time(text)  # type: ignore[arg-type]


def test_format_time() -> None:
    assert units.format_time(datetime(2025, 1, 31, 20, tzinfo=timezone(timedelta(hours=2)))) == "2025-01-31T18:00:00Z"
    assert units.format_time(datetime(2025, 1, 31, 18, 0, 0, 500000, tzinfo=timezone.utc)) == "2025-01-31T18:00:00.5Z"
    with pytest.raises(ValueError):
        units.format_time(datetime(2025, 1, 31))


def test_parse_decimal() -> None:
    assert units.parse_decimal("0.05") == Decimal("0.05")
    for bad in ("abc", "1e-2", 0.05):
        with pytest.raises(ValueError):
            units.parse_decimal(bad)  # type: ignore[arg-type]
