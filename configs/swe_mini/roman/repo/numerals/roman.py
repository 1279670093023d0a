"""Conversion between integers and Roman numerals, 1 to 3999."""

_SYMBOLS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"),
    (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
    (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number):
    """The Roman numeral for ``number`` (an int from 1 to 3999)."""
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 3999:
        raise ValueError(f"cannot write {number!r} as a Roman numeral (1 to 3999)")
    out = []
    for value, symbol in _SYMBOLS:
        count, number = divmod(number, value)
        out.append(symbol * count)
    return "".join(out)


def from_roman(text):
    """The integer a Roman numeral stands for. Lower case and surrounding spaces are accepted."""
    numeral = text.strip().upper()
    if not numeral or any(ch not in _VALUES for ch in numeral):
        raise ValueError(f"not a Roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(numeral):
        value = _VALUES[ch]
        if i + 1 < len(numeral) and _VALUES[numeral[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
