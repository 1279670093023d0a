"""Parse INI-style text: [section] headers, key = value lines, # and ; comments."""

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}


class ParseError(ValueError):
    """A line that is neither blank, a comment, a header nor a key = value pair."""

    def __init__(self, lineno, message):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def parse(text):
    """The sections of ``text`` as ``{section: {key: value}}``.

    Pairs before the first header go to the ``""`` section (left out when empty).
    Keys are lower-cased; keys and values are stripped of surrounding spaces.
    """
    sections = {"": {}}
    current = sections[""]
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError(lineno, f"unclosed section header {line!r}")
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        if "=" not in line:
            raise ParseError(lineno, f"expected 'key = value', got {line!r}")
        parts = line.split("=")
        key, value = parts[0].strip().lower(), parts[1].strip()
        if not key:
            raise ParseError(lineno, "empty key")
        current[key] = value
    if not sections[""]:
        del sections[""]
    return sections


def get_bool(section, key, default=False):
    """``section[key]`` read as a boolean (yes/no, true/false, on/off, 1/0)."""
    if key not in section:
        return default
    word = section[key].lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{key} = {section[key]!r} is not a boolean")
