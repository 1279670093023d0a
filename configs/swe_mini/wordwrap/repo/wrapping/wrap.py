"""wrap, fill and indent: greedy line breaking at whitespace."""


def wrap(text, width):
    """The words of ``text`` packed into lines of at most ``width`` characters.

    Lines break only at whitespace, and runs of whitespace count as one space. A word longer
    than ``width`` is never split: it gets a line of its own.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) < width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text, width):
    """``wrap(text, width)`` joined with newlines."""
    return "\n".join(wrap(text, width))


def indent(text, width, prefix="    "):
    """``text`` wrapped so that, with ``prefix`` in front, lines fit in ``width`` characters."""
    return "\n".join(prefix + line for line in wrap(text, max(1, width - len(prefix))))
