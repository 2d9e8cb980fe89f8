"""Byte sizes as people write them: ``500G``, ``500GB``, ``1.5T``, ``64MiB``, ``500000000000``.

Decimal units (k/K, M, G, T, P: powers of 1000, as disks and S3 bills count) and binary
ones (KiB, MiB, GiB, TiB, PiB, also written Ki, Mi, ...: powers of 1024). Standard library
only: the service's CLI and the client's share it.
"""
from __future__ import annotations

import re
from decimal import Decimal

_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGTP])(I?)B?|B)?\s*$", re.IGNORECASE)
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``500G`` = ``500GB`` = 500 * 10**9, ``1.5T``, ``64MiB`` = 64 * 2**20,
    ``500000000000``. Fractions of a byte are dropped. Raises ValueError naming the expected form."""
    m = _SIZE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"expected a size such as 500G, 500GB, 1.5T, 64MiB or 500000000000, got {text!r}")
    number, prefix, binary = m.group(1), (m.group(2) or "").upper(), m.group(3)
    base = 1024 if binary else 1000
    return int(Decimal(number) * base ** _POWERS[prefix])


def format_size(n: int) -> str:
    """``n`` bytes to three significant digits in decimal units: ``500 B``, ``21.9 MB``, ``156 MB``, ``1.50 TB``."""
    if n < 1000:
        return f"{n} B"
    for unit in range(1, len(_UNITS)):
        value = n / 1000 ** unit
        if value < 999.5 or unit == len(_UNITS) - 1:
            break
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f} {_UNITS[unit]}"
