"""Byte sizes as people type and read them, the same way in both CLIs and every report.

``parse_size("500G") == 500_000_000_000``; ``format_size(156_200_000) == "156.2 MB"``.
Suffixes follow Kubernetes quantities, which the people who run cachesvc already
write in their manifests: ``k``/``K``, ``M``, ``G``, ``T``, ``P``, ``E`` are powers of
1000, ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``, ``Ei`` powers of 1024; a trailing ``B`` is
allowed (``500GB``, ``10GiB``) and the suffix's case is ignored. A bare number is bytes.
``format_size`` prints powers of 1000, as parse_size reads them back.

Stdlib only: the service (``cachesvc purge --max-total-bytes 500G``) imports it too.
"""
from __future__ import annotations

import math
import re

_DECIMAL = ("", "k", "m", "g", "t", "p", "e")
_SIZE_RE = re.compile(r"^\s*(\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})\s*([kmgtpe]?)(i?)(b?)\s*$", re.IGNORECASE)
#: the largest size parse_size accepts by default: 2**62, what the service's integer columns hold with room
MAX_SIZE = 2**62


def parse_size(text: str, *, maximum: int = MAX_SIZE) -> int:
    """``text`` as a whole number of bytes. Raises ValueError with a message a CLI can show as it is.

    ``"500G"``, ``"1.5TB"``, ``"10GiB"``, ``"2048"``, ``"64Ki"``; not negative, not fractional
    bytes (``"1.5"``, ``"0.1k"`` that is not whole), not above ``maximum``.
    """
    if not isinstance(text, str):
        raise ValueError(f"a size must be text such as 500G, got {type(text).__name__}")
    m = _SIZE_RE.match(text)
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(f"{text!r} is not a size: write a number of bytes with an optional unit, "
                         "such as 500G, 1.5TB, 10GiB or 2048")
    number, prefix, binary = m.group(1), m.group(2).lower(), bool(m.group(3))
    scale = (1024 if binary else 1000) ** _DECIMAL.index(prefix)
    if "." in number:  # exact for what people write ("1.5T"), within float precision beyond that
        value = float(number) * scale
        whole = round(value) if math.isfinite(value) else math.inf
        if whole != math.inf and abs(value - whole) > 1e-6 * max(1.0, value):
            raise ValueError(f"{text!r} is not a whole number of bytes")
    else:
        whole = int(number) * scale
    if whole > maximum:
        raise ValueError(f"{text!r} is larger than the limit of {format_size(maximum)}")
    return int(whole)


def format_size(n: float) -> str:
    """``n`` bytes for a person: ``"0 B"``, ``"512 B"``, ``"1.5 kB"``, ``"156.2 MB"``, ``"3.4 TB"``."""
    if abs(n) < 1000:
        return f"{int(n)} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        n /= 1000
        if abs(n) < 999.95:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} EB"


__all__ = ["MAX_SIZE", "format_size", "parse_size"]
