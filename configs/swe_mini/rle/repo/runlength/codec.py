"""encode and decode: runs of a character written as <count><character>."""

from itertools import groupby


def encode(text):
    """``text`` as runs: ``"aaab"`` -> ``"3a1b"``. Digits cannot be encoded (they would be read as counts)."""
    if any(ch.isdigit() for ch in text):
        raise ValueError("text with digits cannot be run-length encoded")
    return "".join(f"{len(list(group))}{ch}" for ch, group in groupby(text))


def decode(data):
    """The text ``data`` encodes: ``"3a1b"`` -> ``"aaab"``."""
    out = []
    count = ""
    for ch in data:
        if ch.isdigit():
            count = ch
            continue
        if not count:
            raise ValueError(f"missing count before {ch!r}")
        out.append(ch * int(count))
        count = ""
    if count:
        raise ValueError(f"count {count} at the end has no character")
    return "".join(out)
