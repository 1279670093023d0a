"""format_size and parse_size with binary units (B, KiB, MiB, ...)."""

import re

UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def format_size(n, precision=1):
    """``n`` bytes in the largest unit that keeps the number below 1024: 1536 -> "1.5 KiB".

    Whole bytes are written without decimals ("512 B"). Negative sizes keep their sign.
    """
    if n < 0:
        return "-" + format_size(-n, precision)
    value = float(n)
    for unit in UNITS:
        if value < 1024 or unit == UNITS[-1]:
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.{precision}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_size(text):
    """The number of bytes ``text`` names: "1.5 KiB" -> 1536 (rounded down); no unit means bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    lookup = {u.lower(): i for i, u in enumerate(UNITS)}
    key = (unit or "B").lower()
    if key not in lookup:
        raise ValueError(f"unknown unit {unit!r} in {text!r}; use one of {', '.join(UNITS)}")
    return int(float(number) * 1024 ** lookup[key])
