"""cachesvc_client.shared.units: sizes as people type them (``500G``) and as the reports print them."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from cachesvc_client.shared.units import MAX_SIZE, format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("2048", 2048), ("0", 0), ("500G", 500 * 10**9), ("500GB", 500 * 10**9), ("500gb", 500 * 10**9),
    ("1.5TB", 1_500_000_000_000), ("10GiB", 10 * 2**30), ("64Ki", 65536), ("64 KiB", 65536), ("2k", 2000),
    (" 5 MB ", 5_000_000), ("0.5k", 500), (".25M", 250_000), ("4Ei", 4 * 2**60), (str(MAX_SIZE), MAX_SIZE),
])
def test_parse_size_reads_kubernetes_style_quantities(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text,says", [
    ("", "not a size"), ("-5", "not a size"), ("nan", "not a size"), ("inf", "not a size"), ("1e400", "not a size"),
    ("5X", "not a size"), ("Gi", "not a size"), ("5 i", "not a size"), ("1.5", "whole number"),
    ("0.0001k", "whole number"), ("9" * 31, "not a size"), ("5E", "larger than the limit"),
    (str(MAX_SIZE + 1), "larger than the limit"),
])
def test_parse_size_refuses_what_is_not_a_size_saying_what_to_write(text, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_size(text)
    assert "\n" not in str(err.value)


def test_parse_size_takes_a_lower_maximum():
    assert parse_size("1G", maximum=10**9) == 10**9
    with pytest.raises(ValueError, match="larger than the limit of 1.0 GB"):
        parse_size("1.1G", maximum=10**9)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1500, "1.5 kB"),
                                    (156_200_000, "156.2 MB"), (999_960, "1.0 MB"), (21_900_000_000, "21.9 GB"),
                                    (3.4e12, "3.4 TB"), (2**62, "4.6 EB")])
def test_format_size_prints_powers_of_1000(n, text):
    assert format_size(n) == text


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_what_format_size_prints_parse_size_reads_back_within_its_rounding(n):
    back = parse_size(format_size(n).replace(" ", ""))
    assert abs(back - n) <= 0.05 * n  # one decimal of a unit n is at least one of
